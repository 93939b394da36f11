"""The embedded backend: one SQLite file in WAL mode, written by one connection.

Durability: a commit is written to the WAL before the store acknowledges it, so a session the
store has acknowledged survives the death of any process (SIGKILL included). The WAL is not
fsynced at every commit (``synchronous=NORMAL``): an OS crash or a power cut may lose the last
commits, never the file's consistency. WAL lets readers (the CLI) run while a server writes,
and ``busy_timeout`` makes writers from other processes wait instead of failing.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from synth_deploy.errors import TraceStoreError
from synth_deploy.tracing._errors import NotATraceDbError, TraceDbMissingError

_MAGIC = b"SQLite format 3\x00"
BUSY_TIMEOUT_S = 30.0
WRITER_CACHE_KIB = 65536
CHECKPOINT_EVERY_S = 0.5
RESTART_WAL_BYTES = 64 << 20
RESTART_WAIT_S = 0.05


class SqliteBackend:
    """Statements against a local SQLite file; thread-safe (one lock around one connection)."""

    is_remote = False

    def __init__(self, path: Path | str, *, create: bool = True, read_only: bool = False) -> None:
        self.path = Path(path)
        self.display = str(self.path)
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._inserted = False
        self._checkpoint_lock = threading.Lock()
        self._checkpointer: sqlite3.Connection | None = None
        self._frame_bytes = 4096 + 24
        memory = str(path) == ":memory:"
        if not memory:
            self._check_path(create)
        target = _read_only_uri(self.path) if read_only and not memory else str(self.path)
        try:
            self._conn = sqlite3.connect(target, isolation_level=None, uri=target != str(
                self.path), check_same_thread=False, timeout=BUSY_TIMEOUT_S)
        except sqlite3.Error as exc:
            raise self._error(exc, "open") from exc
        try:
            # A read first: it rejects corrupt files before anything could write to them.
            self._conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        except sqlite3.Error as exc:
            self._conn.close()
            raise self._error(exc, "open") from exc

    def activate(self) -> None:
        """Switch to WAL; called only once the file is known to be ours
        (setting WAL rewrites the header, which must not happen to a foreign file)."""
        try:
            if str(self.path) != ":memory:":
                mode = self._switch_to_wal()
                if str(mode).lower() != "wal":
                    raise TraceStoreError(f"{self.path}: SQLite refused WAL mode ({mode})",
                                          hint="put the trace database on a local disk")
            # No fsync per commit: an acknowledged commit is in the WAL, which survives the
            # death of any process; an fsync would cost each commit more CPU than its
            # sessions do. Checkpoints still fsync the WAL, then the database.
            self._conn.execute("PRAGMA synchronous=NORMAL")
            # The index pages a large store's inserts touch stay in memory instead of being
            # read back at each batch (the cache is taken as it is used).
            self._conn.execute(f"PRAGMA cache_size=-{WRITER_CACHE_KIB}")
            # A WAL that a checkpoint started over is cut back to this size at the next commit.
            self._conn.execute(f"PRAGMA journal_size_limit={RESTART_WAL_BYTES}")
            self._frame_bytes = self._conn.execute("PRAGMA page_size").fetchone()[0] + 24
        except sqlite3.Error as exc:
            raise self._error(exc, "open") from exc

    def _switch_to_wal(self) -> str:
        # Switching writes the file's header, and so upgrades this connection's read lock
        # to a write lock. When another process holds a write lock on the file (another
        # server creating the same new file), SQLite refuses at once, without waiting:
        # both waiting could deadlock. Asked again once the other is done, it succeeds (or
        # finds the file switched already).
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                return self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
            time.sleep(0.01)

    def checkpoint(self, *, restart_after_bytes: int = RESTART_WAL_BYTES) -> str:
        """One round of moving the WAL into the file, on a connection of its own, so that
        the WAL stays bounded under a writer that never pauses. Returns what it did:
        ``"passive"``, ``"restart"`` or ``"busy"``.

        A PASSIVE checkpoint copies what no reader still needs and never waits for or
        blocks anyone; but under a steady stream of commits it never catches up with the
        last one, and SQLite never starts the WAL over by itself (every page read then
        searches all of it). So once the WAL holds ``restart_after_bytes``, a RESTART
        checkpoint copies the rest while commits wait, and waits for readers still on the
        WAL for `RESTART_WAIT_S` at most: a long read makes it give up (``"busy"``) rather
        than hold the writer, and a later round tries again. After a restart the next
        commit starts the WAL over (cut back to `RESTART_WAL_BYTES`).
        """
        with self._checkpoint_lock:
            if self._closed.is_set():
                return "busy"
            if self._checkpointer is None:
                self._checkpointer = sqlite3.connect(str(self.path), timeout=RESTART_WAIT_S,
                                                     check_same_thread=False)
            conn = self._checkpointer
            try:
                _, frames, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                if frames * self._frame_bytes < restart_after_bytes:
                    return "passive"
                busy, _, _ = conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
            except sqlite3.OperationalError:  # busy or locked: the wait is short
                return "busy"
            return "busy" if busy else "restart"

    def checkpoint_in_background(self, every_s: float = CHECKPOINT_EVERY_S,
                                 restart_after_bytes: int = RESTART_WAL_BYTES) -> None:
        """`checkpoint` every ``every_s`` from a thread of its own, in place of SQLite's
        automatic checkpoints, which run inside whichever commit crosses the threshold
        (a pause for every rollout waiting on that commit). The thread ends with the
        connection."""
        with self._lock:
            self._conn.execute("PRAGMA wal_autocheckpoint=0")

        def run() -> None:
            try:
                while not self._closed.wait(every_s):
                    self.checkpoint(restart_after_bytes=restart_after_bytes)
            except sqlite3.Error:
                pass  # the next opener (or the last connection to close) checkpoints

        threading.Thread(target=run, daemon=True, name="synth-deploy-checkpoint").start()

    def trace_statements(self, callback: Callable[[str], None] | None) -> None:
        """SQLite's trace hook on this connection: ``callback(sql)`` for every statement."""
        with self._lock:
            self._conn.set_trace_callback(callback)

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
                return [dict(zip(cols, row, strict=False)) for row in cur.fetchall()]
            except sqlite3.Error as exc:
                raise self._error(exc, "read") from exc

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """What `query` reads, as tuples in the statement's column order (for hot loops)."""
        with self._lock:
            try:
                return self._conn.execute(sql, tuple(params)).fetchall()
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

    def insert_sessions(self, sessions: list[Any]) -> None:
        """Insert every row of ``sessions`` in one IMMEDIATE transaction (all or nothing).

        Inside the transaction no other writer can take ids, so rows get theirs from the
        current maximum: children carry their parents' ids instead of looking them up.
        """
        from synth_deploy.tracing._db._rows import ID_TABLES, insert_rows

        with self._lock:
            conn = self._conn
            try:
                if not self._inserted:
                    # Each row's statement journal (its pages as they were, in case the
                    # statement fails) is a temporary file by default, written for nothing
                    # durable: an insert's journal is a few pages, kept in memory. Set here,
                    # not at open, as a migration's journal and index sorts can be as big as
                    # the file.
                    conn.execute("PRAGMA temp_store=MEMORY")
                    self._inserted = True
                conn.execute("BEGIN IMMEDIATE")
                top = conn.execute("SELECT " + ", ".join(
                    f"(SELECT MAX(id) FROM {t})" for t in ID_TABLES)).fetchone()
                next_ids = tuple((n or 0) + 1 for n in top)
                for sql, rows in insert_rows(sessions, next_ids):  # type: ignore[arg-type]
                    conn.executemany(sql, rows)
                conn.execute("COMMIT")
            except BaseException as exc:
                # Whatever failed (SQLite, or a session whose rows cannot be built), the
                # transaction ends here: left open, it would refuse every later write.
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise self._error(exc, "write") from exc
                raise

    def close(self) -> None:
        with self._lock:
            self._conn.close()
        self._closed.set()
        with self._checkpoint_lock:
            if self._checkpointer is not None:
                self._checkpointer.close()
                self._checkpointer = None


def _read_only_uri(path: Path) -> str:
    """A URI SQLite opens read-only, leaving every file as it is.

    ``mode=ro`` refuses writes. A WAL file with no ``-wal`` beside it has no connection open
    (the last one to close removes it), yet a read-only connection would create ``-wal`` and
    ``-shm`` and leave them behind: such a file is opened ``immutable`` instead.
    """
    uri = f"{path.resolve().as_uri()}?mode=ro"
    try:
        with path.open("rb") as fh:
            header = fh.read(20)
    except OSError:
        return uri
    wal_mode = len(header) == 20 and header[18] == 2
    if wal_mode and not Path(f"{path}-wal").exists():
        uri += "&immutable=1"
    return uri


__all__ = ["SqliteBackend"]
