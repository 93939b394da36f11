"""The embedded backend: one SQLite file in WAL mode, written by one connection.

Durability: ``synchronous=FULL`` fsyncs the WAL at every commit, so a session the store has
acknowledged survives SIGKILL and power loss; WAL lets readers (the CLI) run while a server
writes, and ``busy_timeout`` makes writers from other processes wait instead of failing.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from synth_deploy.errors import TraceStoreError
from synth_deploy.tracing._errors import NotATraceDbError, TraceDbMissingError

_MAGIC = b"SQLite format 3\x00"
BUSY_TIMEOUT_S = 30.0


class SqliteBackend:
    """Statements against a local SQLite file; thread-safe (one lock around one connection)."""

    is_remote = False

    def __init__(self, path: Path | str, *, create: bool = True) -> None:
        self.path = Path(path)
        self.display = str(self.path)
        self._lock = threading.Lock()
        memory = str(path) == ":memory:"
        if not memory:
            self._check_path(create)
        try:
            self._conn = sqlite3.connect(str(self.path), isolation_level=None,
                                         check_same_thread=False, timeout=BUSY_TIMEOUT_S)
        except sqlite3.Error as exc:
            raise self._error(exc, "open") from exc
        try:
            # A read first: it rejects corrupt files before anything could write to them.
            self._conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        except sqlite3.Error as exc:
            self._conn.close()
            raise self._error(exc, "open") from exc

    def activate(self) -> None:
        """Switch to WAL and full fsync; called only once the file is known to be ours
        (setting WAL rewrites the header, which must not happen to a foreign file)."""
        try:
            if str(self.path) != ":memory:":
                mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise TraceStoreError(f"{self.path}: SQLite refused WAL mode ({mode})",
                                          hint="put the trace database on a local disk")
            self._conn.execute("PRAGMA synchronous=FULL")
        except sqlite3.Error as exc:
            raise self._error(exc, "open") from exc

    def _check_path(self, create: bool) -> None:
        try:
            self._check_path_unsafe(create)
        except OSError as exc:
            raise TraceStoreError(f"cannot use {self.path}: {exc.strerror or exc}",
                                  hint="check the path and its folders' permissions, or "
                                       "choose another --trace-db") from exc

    def _check_path_unsafe(self, create: bool) -> None:
        path = self.path
        if path.is_dir():
            raise NotATraceDbError(f"{path} is a directory, not a trace database file",
                                   hint=f"use a file inside it, e.g. {path / 'synth_ai.db'}")
        if path.exists():
            try:
                with path.open("rb") as fh:
                    head = fh.read(16)
            except OSError as exc:
                raise TraceStoreError(f"cannot read trace database {path}: {exc.strerror}",
                                      hint="check the file's permissions") from exc
            if head and head != _MAGIC:
                raise NotATraceDbError(
                    f"{path} is not a SQLite database (it was left untouched)",
                    hint="point --trace-db / SYNTH_TRACES_DB at another file")
            return
        if not create:
            raise TraceDbMissingError(
                f"no trace database at {path} yet",
                hint="run `synth-deploy traces init`, or serve with tracing to create it")
        folder = path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TraceStoreError(f"cannot create the folder {folder} for traces: "
                                  f"{exc.strerror}",
                                  hint="choose a writable location with --trace-db") from exc
        if not os.access(folder, os.W_OK | os.X_OK):
            raise TraceStoreError(f"the folder {folder} is read-only: cannot create {path.name}",
                                  hint="choose a writable location with --trace-db")

    def _error(self, exc: sqlite3.Error, doing: str) -> TraceStoreError:
        text = str(exc)
        if "not a database" in text or "malformed" in text or "corrupt" in text:
            return NotATraceDbError(
                f"{self.path} is corrupt or not a SQLite database ({text}); it was left as is",
                hint="move it aside or point --trace-db at another file")
        if "readonly" in text or "read-only" in text or "unable to open" in text:
            return TraceStoreError(
                f"cannot {doing} {self.path}: {text}",
                hint="the file or its folder is read-only; choose a writable --trace-db")
        if "locked" in text or "busy" in text:
            return TraceStoreError(f"{self.path} stayed locked for {BUSY_TIMEOUT_S:g}s: {text}",
                                   hint="another process holds a long write transaction")
        return TraceStoreError(f"trace database {self.path}: cannot {doing}: {text}")

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        with self._lock:
            try:
                cur = self._conn.execute(sql, tuple(params))
                cols = [d[0] for d in cur.description or ()]
                return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]
            except sqlite3.Error as exc:
                raise self._error(exc, "read") from exc

    def run(self, statements: Sequence[tuple[str, Sequence[Any]]], *,
            transaction: bool = True) -> None:
        """Run ``statements`` in one IMMEDIATE transaction (all or nothing)."""
        with self._lock:
            try:
                if transaction:
                    self._conn.execute("BEGIN IMMEDIATE")
                for sql, params in statements:
                    self._conn.execute(sql, tuple(params))
                if transaction:
                    self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise self._error(exc, "write") from exc

    def close(self) -> None:
        with self._lock:
            self._conn.close()


__all__ = ["SqliteBackend"]
