"""The trace Volume: how a deployed app's traces outlive its containers.

A container's trace store hands each session to its session log (`TraceDbSetting.
session_log`: one record, made by the server, held in memory; no writer child, no commit,
no file; see `synth_deploy.tracing.SessionLog`). A thread of its own takes, every interval,
what the log holds and writes it into a file on the app's Modal Volume, then commits the
Volume:

    <mount>/<app name>/<container id>.<n>.log   the records held since the last copy
    <mount>/<app name>/<container id>.<n>.db    rows and marks new in the store (rare)

The records are written as they are: no parsing, no SQL (the container's CPU is its
rollouts'). `traces pull` decodes them and builds their rows at home, where CPU after the
run is free. The store itself gains rows only for a session the log cannot hold (one
msgpack has no type for) and marks of answers lost (`lost_answer`, carried): when it has,
a SQLite segment is copied too, in one read transaction of the store (one consistent
state; SQLite runs it without the GIL). Each file is written beside its final name and
renamed into place, so neither our commit nor Modal's background one can catch half a
file; a file is never written again. So each copy, and each upload, is as large as what is
new, however long the container has run. Each container writes only its own files
(numbered in one sequence), so containers never race on one (on a Volume the last writer of
a file wins); `traces pull` stores a session found twice once.

The request path never waits: rollouts hand sessions to the log, the thread takes them
from it. What a killed container can lose is what it recorded since its last copy: at most
one interval (``ModalSettings.trace_commit_s``). A container that drains makes a last copy
and commit after its last rollout answered. A copy that fails gives its records back to
the log, for the next; a file that was written but whose commit failed is committed with
the next.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from synth_deploy.tracing import session_log, write_session_log

logger = logging.getLogger("synth_deploy.modal")

TRACE_VOLUME_MOUNT = "/synth-traces"
# What the plan tells the container (plain variables, no secrets).
TRACE_VOLUME_VAR = "SYNTH_TRACE_VOLUME"  # the Volume's name
TRACE_VOLUME_DIR_VAR = "SYNTH_TRACE_VOLUME_DIR"  # where this app's files go on it
TRACE_COMMIT_VAR = "SYNTH_TRACE_COMMIT_S"
# The container's memory (MiB) as its `ModalSettings.memory` asks for it: its session log
# holds a share of it (`synth_deploy.tracing.pending_limit`).
CONTAINER_MEMORY_VAR = "SYNTH_CONTAINER_MEMORY_MIB"
DEFAULT_TRACE_COMMIT_S = 10.0
SNAPSHOT_SUFFIX = ".db"
LOG_SUFFIX = ".log"
_PARTIAL_SUFFIX = ".partial"
# <container id>.<n>.db or .log; a plain <container id>.db is a whole store (older deploys
# wrote one).
_SEGMENT = re.compile(r"^(?P<container>.+?)(?:\.(?P<n>\d+)\.(?:db|log)|\.db)$")

# Rows that belong to a session, copied with the new sessions: table -> which of its rows
# (those of the segment's sessions; the token rows, those of the segment's events).
_OF_NEW_SESSIONS = "session_id IN (SELECT session_id FROM segment.session_traces)"
_SESSION_ROWS = {
    **dict.fromkeys(("session_timesteps", "events", "messages", "outcome_rewards",
                     "event_rewards"), _OF_NEW_SESSIONS),
    "lm_call_tokens": "event_id IN (SELECT id FROM segment.events)",
}
_AMENDMENTS = "session_amendments"
# Small tables copied whole: the schema's version, lost answers (waiting for their session;
# in a container, every one: `traces pull` applies them), synth-ai's experiment tables. The
# running totals are rebuilt by the segment's triggers.
_WHOLE_TABLES = ("synth_deploy_schema", _AMENDMENTS, "experiments", "systems",
                 "system_versions", "experimental_systems")


@dataclass(frozen=True)
class _Copied:
    """How far a container's copies reach in its local store."""

    session_rowid: int = 0  # session_traces rows up to it
    amendment_rowid: int = 0  # session_amendments rows up to it


def default_trace_volume(app_name: str) -> str:
    """The trace Volume of the Modal app ``app_name`` unless its settings name another."""
    return f"{app_name}-traces"


def segment_name(container: str, n: int, suffix: str = SNAPSHOT_SUFFIX) -> str:
    """The file name of ``container``'s file ``n`` (a SQLite segment, or with
    `LOG_SUFFIX` a copy of its session log's records)."""
    return f"{container}.{n}{suffix}"


def trace_file_container(name: str) -> str | None:
    """The container a trace file on the Volume belongs to (its segment's or its whole
    store's), or None for a name that is neither."""
    match = _SEGMENT.match(name)
    return None if match is None else match["container"]


def modal_volume_commit(name: str) -> Callable[[], None]:
    """Commit the mounted Volume ``name`` (Modal's client, present in every Modal container)."""
    import modal

    volume = modal.Volume.from_name(name)
    return volume.commit


class VolumeSnapshots:
    """Copies what the local store ``source`` gained into a new segment of ``container``
    in ``folder`` and commits, every ``every_s`` seconds when something changed, and once
    more at `stop`."""

    def __init__(self, source: Path, folder: Path, container: str,
                 commit: Callable[[], None], every_s: float) -> None:
        self.source = source
        self.folder = folder
        self.container = container
        self.every_s = every_s
        self.snapshots = 0  # segments written
        self._commit = commit
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._seen_version: int | None = None
        self._copied = _Copied()  # how far the segments written so far reach
        self._uncommitted = False  # a segment is in place whose commit failed
        self._last_number: int | None = None  # of this container's newest segment
        self._thread: threading.Thread | None = None

    @property
    def pattern(self) -> str:
        """How this container's files are named, for the user."""
        return f"{self.container}.<n>{LOG_SUFFIX}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="trace-volume", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.snapshot()

    def snapshot(self) -> bool:
        """Copy what the session log and the local store gained since the last copy, and
        commit; False when they had gained nothing, or a copy or the commit failed (logged:
        traces stay in the container, and the next snapshot copies or commits them)."""
        with self._lock:
            try:
                wrote = False
                if self._write_log_copy():
                    wrote = self._uncommitted = True
                if self._conn is None and self.source.exists():
                    self._conn = sqlite3.connect(self.source, isolation_level=None,
                                                 check_same_thread=False)
                if self._conn is not None:
                    # data_version changes when another connection (the writer) commits.
                    version = self._conn.execute("PRAGMA data_version").fetchone()[0]
                    if version != self._seen_version and self._write_segment():
                        wrote = self._uncommitted = True
                    self._seen_version = version
                if not self._uncommitted:
                    return False
                self._commit()
                self._uncommitted = False
            except Exception as exc:  # the Volume or the disk: the app keeps serving
                logger.warning("trace snapshot to %s failed: %s", self.folder, exc)
                return False
            return wrote

    def _write_log_copy(self) -> bool:
        """What the session log holds, in the next file; False when it held nothing. A copy
        that fails gives the records back, for the next."""
        log = session_log(self.source)
        records = log.take()
        if not records:
            return False
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            number = self._next_number()
            final = self.folder / segment_name(self.container, number, LOG_SUFFIX)
            partial = final.with_name(final.name + _PARTIAL_SUFFIX)
            write_session_log(partial, records)
            partial.replace(final)
        except BaseException:
            log.give_back(records)
            raise
        self._last_number = number
        self.snapshots += 1
        return True

    def _write_segment(self) -> bool:
        """The next segment, in place; False when there was nothing new to put in it."""
        assert self._conn is not None
        conn = self._conn
        self.folder.mkdir(parents=True, exist_ok=True)
        number = self._next_number()
        final = self.folder / segment_name(self.container, number)
        partial = final.with_name(final.name + _PARTIAL_SUFFIX)
        partial.unlink(missing_ok=True)
        _create_schema(conn, partial)
        conn.execute("ATTACH DATABASE ? AS segment", (str(partial),))
        try:
            conn.execute("BEGIN")  # one read transaction: every table as of one commit
            try:
                reached, news = self._copy_rows(conn)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        finally:
            conn.execute("DETACH DATABASE segment")
        if not news:
            partial.unlink(missing_ok=True)
            return False
        partial.replace(final)
        self._last_number, self._copied = number, reached
        self.snapshots += 1
        return True

    def _copy_rows(self, conn: sqlite3.Connection) -> tuple[_Copied, int]:
        """(how far the segment reaches, how many new things it holds: sessions, and new
        lost answers)."""
        newest = conn.execute("SELECT COALESCE(MAX(rowid), 0) FROM main.session_traces"
                              ).fetchone()[0]
        conn.execute("INSERT INTO segment.session_traces SELECT * FROM main.session_traces "
                     "WHERE rowid > ? AND rowid <= ?", (self._copied.session_rowid, newest))
        for table, which in _SESSION_ROWS.items():
            if _has_table(conn, table):
                conn.execute(f"INSERT INTO segment.{table} SELECT * FROM main.{table} "
                             f"WHERE {which}")
        for table in _WHOLE_TABLES:
            if _has_table(conn, table):
                conn.execute(f"INSERT INTO segment.{table} SELECT * FROM main.{table}")
        # A lost answer marked since (`lost_answer`, carried: a new row each time).
        marked = self._copied.amendment_rowid
        if _has_table(conn, _AMENDMENTS):
            marked = conn.execute(f"SELECT COALESCE(MAX(rowid), 0) FROM main.{_AMENDMENTS}"
                                  ).fetchone()[0]
        sessions = conn.execute("SELECT COUNT(*) FROM segment.session_traces").fetchone()[0]
        news = sessions + (marked > self._copied.amendment_rowid)
        return _Copied(newest, marked), news

    def _next_number(self) -> int:
        if self._last_number is None:  # after any segment of this container id there
            # already (a restarted process); the folder is listed once, however many
            # files the app's containers have put in it
            self._last_number = max(
                (int(m["n"]) for path in self.folder.glob(f"{self.container}.*")
                 if (m := _SEGMENT.match(path.name)) and m["n"]
                 and m["container"] == self.container), default=0)
        return self._last_number + 1

    def stop(self) -> None:
        """The last segment and commit (the container drains), then stop."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.every_s + 60)
        self.snapshot()
        with self._lock, contextlib.suppress(sqlite3.Error):
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _has_table(conn: sqlite3.Connection, table: str) -> bool:
    return conn.execute("SELECT 1 FROM main.sqlite_master WHERE type = 'table' AND name = ?",
                        (table,)).fetchone() is not None


def _create_schema(conn: sqlite3.Connection, path: Path) -> None:
    """An empty store at ``path`` with the schema of ``conn``'s (tables, then indexes and
    triggers, so the segment's totals fill as its rows go in). A plain rollback-journal
    file: readable alone, with no -wal/-shm beside it."""
    rows = conn.execute("SELECT type, name, sql FROM main.sqlite_master WHERE sql IS NOT NULL "
                        "AND name NOT LIKE 'sqlite_%'").fetchall()
    order = {"table": 0, "index": 1, "trigger": 2, "view": 3}
    out = sqlite3.connect(path, isolation_level=None)
    try:
        out.execute("BEGIN")
        for _kind, _name, sql in sorted(rows, key=lambda row: order.get(row[0], 4)):
            out.execute(sql)
        out.execute("COMMIT")
    finally:
        out.close()


def with_snapshots(app: Any, snapshots: VolumeSnapshots) -> Any:
    """``app`` whose lifespan starts ``snapshots`` once it is up and makes the last one
    after it has shut down (every rollout answered, every trace in the local store)."""
    import asyncio

    async def traced_app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return

        async def send_after(message: Any) -> None:
            if message["type"] == "lifespan.startup.complete":
                snapshots.start()
            elif message["type"] == "lifespan.shutdown.complete":
                await asyncio.to_thread(snapshots.stop)
            await send(message)

        await app(scope, receive, send_after)

    return traced_app


__all__ = ["CONTAINER_MEMORY_VAR", "DEFAULT_TRACE_COMMIT_S", "LOG_SUFFIX", "SNAPSHOT_SUFFIX",
           "TRACE_COMMIT_VAR", "TRACE_VOLUME_DIR_VAR", "TRACE_VOLUME_MOUNT", "TRACE_VOLUME_VAR",
           "VolumeSnapshots", "default_trace_volume", "modal_volume_commit", "segment_name",
           "trace_file_container", "with_snapshots"]
