"""`TraceStore`: where finished rollouts are written, and the reads the CLI needs.

A store is a `TraceDatabase` (a SQLite file or a libSQL server, schema made current) and
the writers that commit to it: the store's own writer thread (`ThreadWriter`: group
commit, one writer per process), and for a served app's event loop a writer child process
(`LoopWriter`, see `use_writer_process`), which keeps SQL off the server's GIL. Either way
`write_session` returns only after the COMMIT of its batch: a 200 means the trace is in
the file (see `_db._sqlite` for what survives what). A store whose readers are elsewhere
(`TraceDbSetting.session_log`: a Modal container's) hands each session to its log instead
(`_write._log`), which holds it until a copier takes it.

Readers (`synth_deploy.tracing._read`) read through ``store.database``. Opening a store
builds the rows of the sessions a busy writer child left in its journal (`_write._journal`),
so every read sees every acknowledged session.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

from synth_deploy.deadlines import deadline
from synth_deploy.errors import TraceStoreError
from synth_deploy.tracing._config import TraceDbSetting, parse_trace_db
from synth_deploy.tracing._db._database import TraceDatabase
from synth_deploy.tracing._db._select import SessionFilter, SessionSql
from synth_deploy.tracing._db._stats import TraceStats, store_stats
from synth_deploy.tracing._errors import NotATraceDbError, SessionNotFoundError
from synth_deploy.tracing._rollout_facts import RolloutFacts, describe_session, lost_answer
from synth_deploy.tracing._session import SessionTrace
from synth_deploy.tracing._times import zoned
from synth_deploy.tracing._write import _journal
from synth_deploy.tracing._write._log import session_log
from synth_deploy.tracing._write._thread import ThreadWriter

logger = logging.getLogger("synth_deploy.tracing")

WRITE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class SessionSummary:
    """One row of `traces ls`."""

    session_id: str
    created_at: str
    app_id: str | None
    run_id: str | None
    seed: int | None
    model: str | None
    status: str | None
    total_reward: float | None
    num_timesteps: int
    num_events: int
    num_messages: int
    app_version: str | None = None  # which code of the app made it (`AppIdentity`)
    app_digest: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class TraceStore:
    """A trace database and its writers; use `open_trace_store` to get one.

    Thread- and coroutine-safe; close it (or use it as a context manager) to flush pending
    writes and stop its writers. A write that does not commit within ``write_timeout_s``
    raises `TraceStoreError`.

    ``read_only``: the file is opened read-only and never changed (no migration, no journal
    mode switch); reads work on every schema version this code knows, writes are refused.
    ``writer_process=False``: a served app's loop commits through the thread too.
    """

    def __init__(self, setting: TraceDbSetting, *, create: bool = True,
                 read_only: bool = False, write_timeout_s: float | None = WRITE_TIMEOUT_S,
                 connect_timeout_s: float | None = None, writer_process: bool = True) -> None:
        self.setting = setting
        self.read_only = read_only
        self.write_timeout_s = write_timeout_s
        self._database = TraceDatabase(setting, create=create, read_only=read_only,
                                       connect_timeout_s=connect_timeout_s)
        self._catch_up()
        self._thread = ThreadWriter(self._database)
        # A served app's event loop commits to a local file through a child process of its
        # own, so it spends no GIL time on SQL: one per loop, replaced when it dies.
        self._children: dict[asyncio.AbstractEventLoop, Any] = {}
        self._children_lock = threading.Lock()
        local_file = not setting.is_remote and not read_only and not self._database.in_memory
        # A store whose readers are elsewhere hands each session to its log instead.
        self._log = session_log(setting.path, setting.session_log_limit) \
            if setting.session_log and local_file and setting.path is not None else None
        self._children_allowed = writer_process and local_file and self._log is None

    @property
    def database(self) -> TraceDatabase:
        """The database, for readers: the sessions a busy writer child journaled (this
        store's or another process's) get their rows first (`_catch_up`)."""
        self._catch_up()
        return self._database

    @property
    def display(self) -> str:
        return self.setting.display

    @property
    def schema_version(self) -> int:
        return self._database.schema_version

    # -- writes ---------------------------------------------------------------------------

    async def write_session(self, session: SessionTrace,
                            rollout: RolloutFacts | None = None) -> None:
        """Store ``session``; returns once it is committed (with `TraceDbSetting.session_log`:
        once its log holds it). Safe from many coroutines.

        ``rollout``: the facts of the rollout it recorded, which become its metadata
        (`describe_session`) in the writer child when there is one, off the caller's loop."""
        if self._log is not None:
            self._check_writable()
            if self._log.append(session, rollout):
                return  # the log holds it: no commit to wait for
        loop = asyncio.get_running_loop()
        child = self._children.get(loop)
        if child is not None and not child.alive:
            child = self.use_writer_process()
        if child is not None and child.ready:
            sent = child.submit(session, rollout)
            if sent is not None:
                await sent  # bounded by the child's own watch
                return
        # No child, one still starting, or a session it is not sent (an object of the app's
        # own class, which it could not rebuild; a gigabyte encoded): the writer thread
        # commits it.
        self._check_writable()
        if rollout is not None:
            describe_session(session, rollout)
        future = loop.create_future()
        self._thread.submit([session], (loop, future))
        try:
            with deadline(self.write_timeout_s):
                await future
        except TimeoutError:
            raise self._timeout_error() from None

    async def record_lost_answer(self, session_id: str, error: dict[str, Any]) -> None:
        """Record that the client of the stored session ``session_id`` never got its ``ok``
        answer (``error``: what it got instead); a session stored otherwise is left as it
        is. Runs on a worker thread, as a second writer beside the writer child (a session
        it journaled gets its rows first, unless they are built elsewhere: then the mark
        waits in the file for the store that builds them, `TraceDbSetting.session_log`)."""
        self._check_writable()
        elsewhere = self.setting.session_log

        def amend() -> None:
            if not elsewhere:
                _journal.expand(self._database, session_id=session_id)
            self._database.run(lost_answer(session_id, error, carried=elsewhere))

        try:
            with deadline(self.write_timeout_s):
                await asyncio.to_thread(amend)
        except TimeoutError:
            raise self._timeout_error() from None

    def write_session_sync(self, session: SessionTrace) -> None:
        """Blocking `write_session`, for code outside an event loop."""
        self.write_sessions_sync([session])

    def write_sessions_sync(self, sessions: list[SessionTrace]) -> None:
        """Store ``sessions`` together (one commit, with whatever else waits); returns once
        committed. Each is stored or fails alone: the first error is raised."""
        self._check_writable()
        if self._log is not None:
            sessions = [s for s in sessions if not self._log.append(s)]
            if not sessions:
                return
        waiter: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread.submit(list(sessions), waiter)
        try:
            waiter.result(self.write_timeout_s)
        except concurrent.futures.TimeoutError:
            raise self._timeout_error() from None

    def start(self) -> None:
        """Commit in a writer child from now on (the server's `TraceSink` start; until the
        child is ready, writes commit here). A closed or read-only store refuses each write
        instead."""
        try:
            self.use_writer_process()
        except TraceStoreError:
            pass

    def use_writer_process(self) -> Any:
        """Commit the running loop's writes in a child process from now on (a served app
        calls this as its server starts; a child that dies is replaced on the next write).
        Returns the child's `LoopWriter` (``ready`` once it has opened the file), or None
        for a store that writes through its thread (remote, in memory, read-only)."""
        if not self._children_allowed:
            return None
        loop = asyncio.get_running_loop()
        with self._children_lock:
            self._check_writable()
            child = self._children.get(loop)
            if child is not None and not child.alive:
                logger.warning("%s; a new one takes over (the writes it held failed, and "
                               "were answered so)", child.exit_error().message)
            if child is None or not child.alive:
                from synth_deploy.tracing._write._child import LoopWriter

                for old in [lp for lp in self._children if lp.is_closed()]:
                    self._children.pop(old).finish(0)  # it exits once it has committed
                child = self._children[loop] = LoopWriter(
                    self.setting, loop, timeout_s=self.write_timeout_s,
                    timeout_error=self._timeout_error)
            return child

    def _catch_up(self) -> None:
        """Build the rows of the sessions in the journal, if any: at open and before each
        read, so a store held open (the viewer's) sees what a busy writer child journaled
        since."""
        if self.setting.is_remote:
            return
        try:
            if not _journal.any_waiting(self._database):
                return
        except TraceStoreError:
            return  # a closed store: the read that follows says so
        # A read-only store builds them through a connection of its own, which leaves the
        # file as it was but for where those sessions are kept.
        try:
            if not self.read_only:
                _journal.expand(self._database)
                return
            writable = TraceDatabase(self.setting, create=False)
            try:
                _journal.expand(writable)
            finally:
                writable.close()
            # Reopened: a read-only connection may not look for changes (`_read_only_uri`).
            self._database.close()
            self._database = TraceDatabase(self.setting, read_only=True)
        except TraceStoreError as exc:
            logger.warning("%s: %d sessions are still in its journal and are not shown (%s)",
                           self.display, _journal.waiting(self._database), exc.message)

    def _check_writable(self) -> None:
        if self.read_only:
            raise TraceStoreError(f"the trace store for {self.display} was opened read-only",
                                  hint="open it with read_only=False to write")
        if self._thread.closed:
            raise TraceStoreError(f"the trace store for {self.display} is closed")

    def _timeout_error(self) -> TraceStoreError:
        return TraceStoreError(f"trace write to {self.display} did not finish within "
                               f"{self.write_timeout_s:g}s")

    # -- reads ----------------------------------------------------------------------------

    def count_sessions(self, *, app: str | None = None, status: str | None = None,
                       model: str | None = None, app_digest: str | None = None) -> int:
        """How many sessions are stored (those that pass the filters given)."""
        where, params, _ = SessionSql(self.database).where(
            SessionFilter(app=app, status=status, model=model, app_digest=app_digest))
        return int(self._database.query(f"SELECT COUNT(*) AS n FROM session_traces s{where}",
                                       params)[0]["n"])

    def list_sessions(self, *, limit: int | None = 20, app: str | None = None,
                      status: str | None = None, since: str | None = None,
                      min_reward: float | None = None, model: str | None = None,
                      app_digest: str | None = None,
                      newest_first: bool = True) -> list[SessionSummary]:
        """The sessions that pass the filters (`SessionFilter`'s rules; ``since``: stored
        timestamp text, as `since_timestamp` makes it), newest first unless told."""
        sql = SessionSql(self.database)
        where, params, _ = sql.where(SessionFilter(app=app, status=status, since=since,
                                                   min_reward=min_reward, model=model,
                                                   app_digest=app_digest))
        e = sql.expr
        query = (f"SELECT s.session_id, s.created_at, {e['app']} AS app_id, {e['run']} AS "
                 f"run_id, {e['seed']} AS seed, {e['model']} AS model_name, {e['status']} AS "
                 f"status, {e['reward']} AS total_reward, s.num_timesteps, s.num_events, "
                 f"s.num_messages, {e['app_version']} AS app_version, {e['app_digest']} AS "
                 f"app_digest FROM session_traces s{where} ORDER BY s.created_at "
                 f"{'DESC' if newest_first else 'ASC'}, s.session_id")
        if limit is not None:
            query += f" LIMIT {int(limit)}"
        return [SessionSummary(
            session_id=r["session_id"], created_at=str(zoned(r["created_at"])),
            app_id=r["app_id"],
            run_id=r["run_id"], seed=r["seed"], model=r["model_name"], status=r["status"],
            total_reward=r["total_reward"], num_timesteps=r["num_timesteps"],
            num_events=r["num_events"], num_messages=r["num_messages"],
            app_version=_text(r["app_version"]), app_digest=_text(r["app_digest"]))
            for r in self._database.query(query, params)]

    def get_session(self, session_id: str) -> SessionTrace:
        """The stored session with this id, or the one id that starts with it."""
        session = self.database.session(session_id)
        if session is not None:
            return session
        found = self._database.sessions_starting_with(session_id, limit=2)
        if len(found) > 1:
            raise SessionNotFoundError(f"{session_id!r} matches several sessions",
                                       hint="give more characters of the id")
        if not found:
            raise SessionNotFoundError(f"no session {session_id!r} in {self.display}",
                                       hint="list them with `synth-deploy traces ls`")
        return found[0]

    def stats(self) -> TraceStats:
        """Counts, tokens, time and cost, overall and per app and model (see `store_stats`)."""
        return store_stats(self.database)

    def table_counts(self) -> dict[str, int]:
        return self.database.table_counts()

    def integrity_check(self) -> str:
        return self.database.integrity_check()

    def check_pages(self) -> None:
        """Raise `TraceStoreError` when a page of the local file is damaged (SQLite's
        ``quick_check``, which reads every page once): what a server checks before it
        writes into a file that the read commands would refuse. A remote or in-memory
        store keeps its own pages: nothing is read."""
        if self.setting.is_remote or self._database.in_memory:
            return
        # The first finding is enough to refuse, and its report may run to many lines.
        found = str(self._database.query("PRAGMA quick_check(1)")[0].get("quick_check"))
        if found != "ok":
            first = [line for line in found.splitlines() if not line.startswith("***")]
            raise NotATraceDbError(
                f"{self.display} has damaged pages (SQLite's quick_check: "
                f"{(first or [found])[0]}); it was left as is",
                hint="move it aside (`sqlite3 FILE .recover` may save its rows) or point "
                     "--trace-db at another file")

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Commit what is queued, stop the writers, close the database.

        Waits up to ``write_timeout_s`` for queued writes; if they take longer, the writer
        thread (or child) finishes them and closes its connection itself.
        """
        with self._children_lock:
            children = list(self._children.values())
            self._children.clear()
        running = self._thread.close(self.write_timeout_s)
        for child in children:
            child.finish(self.write_timeout_s)
        if not running:
            self._database.close()

    def __enter__(self) -> TraceStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TraceStore({self.display!r}, schema_version={self.schema_version})"


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def open_trace_store(setting: TraceDbSetting | str | os.PathLike[str], *,
                     create: bool = True, read_only: bool = False) -> TraceStore:
    """Open (creating and migrating as needed) the trace database ``setting`` names.

    ``setting`` is what `resolve_trace_db` resolved at the entry point; a plain path or URL
    is parsed as given (a remote token must then be in the URL). With ``create=False`` a
    missing local file is an error instead of being created. ``read_only=True`` (what the
    read commands use) implies it, and leaves every byte of the file as it was: no
    migration, no journal mode switch, and writes refused.
    Raises `TraceStoreError` (with a hint) for bad URLs, corrupt or foreign files, newer
    schemas, read-only folders and unreachable servers; nothing is overwritten.
    """
    if not isinstance(setting, TraceDbSetting):
        setting = parse_trace_db(os.fspath(setting))
    return TraceStore(setting, create=create, read_only=read_only)


__all__ = ["SessionSummary", "TraceStats", "TraceStore", "open_trace_store"]
