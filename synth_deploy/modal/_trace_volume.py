"""The trace Volume: how a deployed app's traces outlive its containers.

Each container records into a SQLite store on its own disk, as `serve` does. A thread of its
own copies, every interval, what that store gained since the last copy into a new file on
the app's Modal Volume (a segment), then commits the Volume:

    <mount>/<app name>/<container id>.<n>.db    segment n (1, 2, ...) of one container

A segment is a trace store of its own (the same schema, readable alone): the sessions the
writer child journaled since the segment before (`synth_deploy.tracing._write._journal`),
and any whose rows were committed since, with their timesteps, events, messages, rewards
and token rows. A container's child journals every session (`TraceDbSetting.journal_all`):
one row each, the cheapest write there is, and its rows are built at home by `traces pull`
(the CPU of a container is its rollouts'; a laptop's after the run is free). The copy is
SQL in one read transaction of the local store (one consistent state; SQLite runs it
without the GIL), written beside its final name and renamed into place, so neither our
commit nor Modal's background one can catch half a file; a segment is never written again.
So each copy, and each upload, is as large as what is new, however long the container has
run (copying the whole store grew with its age). Each container writes only its own files,
so containers never race on one (on a Volume the last writer of a file wins); a session
found in two segments (journaled in one, its rows in the next) is the same session, and
`traces pull` stores it once.

The request path never waits: rollouts commit to the local store, the thread copies from
it. What a killed container can lose is what it recorded since its last segment: at most
one interval (``ModalSettings.trace_commit_s``). A container that drains makes a last
segment and commit after its last rollout answered. A segment that was written but whose
commit failed is committed with the next.
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

logger = logging.getLogger("synth_deploy.modal")

TRACE_VOLUME_MOUNT = "/synth-traces"
# What the plan tells the container (plain variables, no secrets).
TRACE_VOLUME_VAR = "SYNTH_TRACE_VOLUME"  # the Volume's name
TRACE_VOLUME_DIR_VAR = "SYNTH_TRACE_VOLUME_DIR"  # where this app's files go on it
TRACE_COMMIT_VAR = "SYNTH_TRACE_COMMIT_S"
DEFAULT_TRACE_COMMIT_S = 10.0
SNAPSHOT_SUFFIX = ".db"
_PARTIAL_SUFFIX = ".partial"
# <container id>.<n>.db; a plain <container id>.db is a whole store (older deploys wrote one).
_SEGMENT = re.compile(r"^(?P<container>.+?)(?:\.(?P<n>\d+))?\.db$")

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
_JOURNAL = "session_journal"


@dataclass(frozen=True)
class _Copied:
    """How far a container's segments reach in its local store."""

    session_rowid: int = 0  # session_traces rows up to it
    journal: tuple[int, str | None] = (0, None)  # the journal row copied last: seq, session
    amendment_rowid: int = 0  # session_amendments rows up to it


def default_trace_volume(app_name: str) -> str:
    """The trace Volume of the Modal app ``app_name`` unless its settings name another."""
    return f"{app_name}-traces"


def segment_name(container: str, n: int) -> str:
    """The file name of ``container``'s segment ``n``."""
    return f"{container}.{n}{SNAPSHOT_SUFFIX}"


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
        return f"{self.container}.<n>{SNAPSHOT_SUFFIX}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="trace-volume", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.snapshot()

    def snapshot(self) -> bool:
        """Write a segment of what the local store gained since the last one and commit;
        False when it had gained nothing, or the copy or commit failed (logged: traces stay
        in the local store, and the next snapshot copies or commits them)."""
        with self._lock:
            try:
                if self._conn is None:
                    if not self.source.exists():
                        return False
                    self._conn = sqlite3.connect(self.source, isolation_level=None,
                                                 check_same_thread=False)
                # data_version changes when another connection (the writer) has committed.
                version = self._conn.execute("PRAGMA data_version").fetchone()[0]
                wrote = version != self._seen_version and self._write_segment()
                if wrote:
                    self._uncommitted = True
                self._seen_version = version
                if not self._uncommitted:
                    return False
                self._commit()
                self._uncommitted = False
            except Exception as exc:  # the Volume or the disk: the app keeps serving
                logger.warning("trace snapshot to %s failed: %s", self.folder, exc)
                return False
            try:
                self._forget_committed()
            except sqlite3.Error as exc:  # kept on disk a while longer: the next one drops them
                logger.warning("committed trace rows stay on this container's disk: %s", exc)
            return wrote

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
        journal_end, journaled = self._copied.journal, 0
        if _has_table(conn, _JOURNAL):
            journal_end, journaled = self._copy_journal(conn)
        # A lost answer marked since (`lost_answer`, carried: a new row each time).
        marked = self._copied.amendment_rowid
        if _has_table(conn, _AMENDMENTS):
            marked = conn.execute(f"SELECT COALESCE(MAX(rowid), 0) FROM main.{_AMENDMENTS}"
                                  ).fetchone()[0]
        sessions = conn.execute("SELECT COUNT(*) FROM segment.session_traces").fetchone()[0]
        news = sessions + journaled + (marked > self._copied.amendment_rowid)
        return _Copied(newest, journal_end, marked), news

    def _forget_committed(self) -> None:
        """Drop from the local store the journal rows now committed to the Volume: a
        container that serves for hours would otherwise keep every session it recorded on
        its disk. (Their pages are reused; the next segment copies every row left, all new.)"""
        assert self._conn is not None
        seq = self._copied.journal[0]
        if seq and _has_table(self._conn, _JOURNAL):
            self._conn.execute(f"DELETE FROM main.{_JOURNAL} WHERE seq <= ?", (seq,))

    def _copy_journal(self, conn: sqlite3.Connection) -> tuple[tuple[int, str | None], int]:
        """Copy the journal rows added since the last segment: (the newest, how many).

        A container's writer child journals every session (`TraceDbSetting.journal_all`),
        so the journal only grows: its new rows are those past the last one copied, taken
        by position however long the container has run. That holds while the row copied
        last is still in place (SQLite gives a new row the largest seq + 1). Once it is
        gone (dropped once committed, `_forget_committed`, or its session built into rows,
        as a store whose child builds rows does) seqs may be given again: every row left
        is copied, and `traces pull` stores a session found twice once."""
        end = conn.execute(f"SELECT seq, session_id FROM main.{_JOURNAL} ORDER BY seq DESC "
                           "LIMIT 1").fetchone()
        if end is None:
            return self._copied.journal, 0
        seq, session_id = self._copied.journal
        if seq and conn.execute(f"SELECT session_id FROM main.{_JOURNAL} WHERE seq = ?",
                                (seq,)).fetchone() != (session_id,):
            seq = 0
        copied = conn.execute(f"INSERT INTO segment.{_JOURNAL} SELECT * FROM main.{_JOURNAL} "
                              "WHERE seq > ? AND seq <= ?", (seq, end[0])).rowcount
        return (end[0], end[1]), copied

    def _next_number(self) -> int:
        if self._last_number is None:  # after any segment of this container id there
            # already (a restarted process); the folder is listed once, however many
            # files the app's containers have put in it
            self._last_number = max(
                (int(m["n"]) for path in self.folder.glob(f"{self.container}.*.db")
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


__all__ = ["DEFAULT_TRACE_COMMIT_S", "SNAPSHOT_SUFFIX", "TRACE_COMMIT_VAR",
           "TRACE_VOLUME_DIR_VAR", "TRACE_VOLUME_MOUNT", "TRACE_VOLUME_VAR",
           "VolumeSnapshots", "default_trace_volume", "modal_volume_commit", "segment_name",
           "trace_file_container", "with_snapshots"]
