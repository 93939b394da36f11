"""`TraceStore`: durable writes of finished rollouts and the reads the CLI needs.

Writes go through one writer thread per store. Sessions that arrive while a commit is in
progress are committed together in the next transaction (group commit), so many concurrent
rollouts cost one commit (or one remote round trip series) per batch instead of one each, and
there is exactly one writer, so "database is locked" cannot happen inside a process.
`write_session` returns only after the COMMIT of its batch: a 200 means the trace is in the
file (see `_sqlite` for what survives what).
A served app's event loop hands its sessions to a writer process instead (`_writer`), which
runs the same group commit without sharing the server's GIL.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from synth_deploy._batches import take_batch
from synth_deploy.deadlines import deadline
from synth_deploy.errors import TraceStoreError
from synth_deploy.tracing._config import TraceDbSetting, parse_trace_db
from synth_deploy.tracing._db import _rows, _totals
from synth_deploy.tracing._db import _schema as schema
from synth_deploy.tracing._errors import (
    SchemaTooNewError,
    SessionConflictError,
    SessionNotFoundError,
    TraceDbMissingError,
)
from synth_deploy.tracing._ledger import CostLedger, stored_ledger
from synth_deploy.tracing._session import SessionTrace

MAX_BATCH = 64
WRITE_TIMEOUT_S = 60.0
logger = logging.getLogger("synth_deploy.tracing")
_STOP = object()


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

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class TraceStats:
    """Totals for `traces stats` and `traces where`."""

    sessions: int = 0
    ok: int = 0
    errors: int = 0
    timesteps: int = 0
    events: int = 0
    messages: int = 0
    lm_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    first_at: str | None = None
    last_at: str | None = None
    by_app: list[dict[str, Any]] = field(default_factory=list)
    by_model: list[dict[str, Any]] = field(default_factory=list)
    ledger: CostLedger = field(default_factory=CostLedger)  # tokens and LM/env/wall time

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "ledger": self.ledger.to_dict()}


class TraceStore:
    """A trace database (embedded SQLite file or remote libSQL), schema ensured on open.

    Use `open_trace_store` to get one. Thread- and coroutine-safe; close it (or use it as a
    context manager) to flush pending writes and stop its writer thread. A write that does not
    commit within ``write_timeout_s`` raises `TraceStoreError`.

    ``read_only``: the file is opened read-only and never changed (no migration, no journal
    mode switch); reads work on every schema version this code knows, writes are refused.
    """

    def __init__(self, setting: TraceDbSetting, *, create: bool = True,
                 read_only: bool = False, write_timeout_s: float | None = WRITE_TIMEOUT_S,
                 connect_timeout_s: float | None = None, writer_process: bool = True) -> None:
        self.setting = setting
        self.read_only = read_only
        self.write_timeout_s = write_timeout_s
        if setting.is_remote:
            from synth_deploy.tracing._db._libsql import LibsqlBackend

            bound = {} if connect_timeout_s is None else {"connect_timeout_s": connect_timeout_s}
            self._db: Any = LibsqlBackend(setting.remote_url or setting.url,
                                          setting.auth_token, display=setting.display, **bound)
        else:
            from synth_deploy.tracing._db._sqlite import SqliteBackend

            self._db = SqliteBackend(setting.path or setting.url,
                                     create=create and not read_only, read_only=read_only)
        self._queue: queue.Queue[Any] = queue.Queue()
        self._writer: threading.Thread | None = None
        self._writer_lock = threading.Lock()
        self._closed = False
        # A server's event loop commits to a local file through a child process of its own
        # (`_writer`, see `use_writer_process`), so it spends no GIL time on SQL. Other
        # writes, remote servers and in-memory databases go through the writer thread.
        self._loop_writers: dict[asyncio.AbstractEventLoop, Any] = {}
        self._writer_process = writer_process and not setting.is_remote and not read_only \
            and str(setting.path) != ":memory:"
        try:
            self.schema_version = self._ensure_schema()
            # Session fields as SQL: columns where they can be trusted, else the metadata.
            columns = {r["name"] for r in self._db.query(
                "SELECT name FROM pragma_table_info('session_traces')")}
            self._fields = schema.session_fields(columns, self.schema_version)
        except BaseException:
            self._db.close()
            raise

    @property
    def display(self) -> str:
        return self.setting.display

    # -- schema ---------------------------------------------------------------------------

    def _version(self) -> int | None:
        tables = [r["name"] for r in self._db.query(
            "SELECT name FROM sqlite_master WHERE type = 'table'")]
        versions: list[int] = []
        if schema.VERSION_TABLE in tables:
            versions = [r["version"] for r in self._db.query(
                f"SELECT version FROM {schema.VERSION_TABLE}")]
        found = schema.detect_version(tables, versions)
        if found is None:
            shown = ", ".join(sorted(t for t in tables if not t.startswith("sqlite_"))[:6])
            from synth_deploy.tracing._errors import NotATraceDbError

            raise NotATraceDbError(
                f"{self.display} is a database but not a trace store (tables: {shown}); "
                "it was left untouched",
                hint="point --trace-db / SYNTH_TRACES_DB at a new or existing trace file")
        return found

    def _ensure_schema(self) -> int:
        current = self._version()
        assert current is not None
        if current > schema.SCHEMA_VERSION:
            raise SchemaTooNewError(
                f"{self.display} has trace schema version {current}, newer than this "
                f"synth-deploy understands ({schema.SCHEMA_VERSION}); it was left untouched",
                hint="upgrade synth-deploy (pip install -U synth-deploy)")
        if self.read_only:
            if current == 0:
                raise TraceDbMissingError(f"{self.display} holds no trace tables yet",
                                          hint="run `synth-deploy traces init` to create them")
            return current
        if hasattr(self._db, "activate"):
            self._db.activate()
        if current == schema.SCHEMA_VERSION:
            return current

        def columns(table: str) -> set[str]:
            return {r["name"] for r in self._db.query(f"PRAGMA table_info({table})")}

        now = _rows.iso(time.time()) or ""
        statements = [s for _, _, stmts in schema.migration_plan(current, columns, now)
                      for s in stmts]
        if current >= 1:  # an existing store, maybe a large one: say why opening it waits
            # It reads every session row once: 11 s for a million sessions of 2.6 GB here,
            # two minutes for 1.4 million of 5 GB read from disk.
            logger.warning("%s: upgrading its trace schema from v%d to v%d, once (seconds to "
                           "minutes for a million sessions)", self.display, current,
                           schema.SCHEMA_VERSION)
        try:
            self._db.run(statements)
        except TraceStoreError:
            # Another process may have migrated first; only its result counts.
            if self._version() != schema.SCHEMA_VERSION:
                raise
        return schema.SCHEMA_VERSION

    # -- writes ---------------------------------------------------------------------------

    async def write_session(self, session: SessionTrace, *, more_coming: bool = False) -> None:
        """Store ``session``; returns once it is committed. Safe from many coroutines.

        ``more_coming``: other writes follow soon (a server with rollouts still running).
        The writer process may then wait up to 10 ms for them, to commit them together.
        """
        loop = asyncio.get_running_loop()
        child = self._loop_writers.get(loop)
        if child is not None and not child.alive:
            child = self.use_writer_process()
        if child is not None and child.ready:
            future = child.submit(session, more_coming)
        else:  # no child, or one still starting: this process's writer thread commits it
            future = loop.create_future()  # settled with one thread-safe call per batch
            self._submit(session, (loop, future))
        try:
            with deadline(self.write_timeout_s):
                await future
        except TimeoutError:
            raise self._timeout_error() from None

    def write_session_sync(self, session: SessionTrace) -> None:
        """Blocking `write_session`, for code outside an event loop."""
        try:
            self._submit(session).result(self.write_timeout_s)
        except concurrent.futures.TimeoutError:
            raise self._timeout_error() from None

    def _timeout_error(self) -> TraceStoreError:
        return TraceStoreError(f"trace write to {self.display} did not finish within "
                               f"{self.write_timeout_s:g}s")

    def use_writer_process(self) -> Any:
        """Commit the running loop's writes in a child process from now on (`create_app`
        calls this as its server starts; a child that dies is replaced on the next write).
        Returns the child's `LoopWriter`, or None for a store that writes through its
        thread (remote, in memory, read-only)."""
        if not self._writer_process:
            return None
        loop = asyncio.get_running_loop()
        with self._writer_lock:
            self._check_writable()
            writer = self._loop_writers.get(loop)
            if writer is None or not writer.alive:
                from synth_deploy.tracing._write._child import LoopWriter

                for old in [lp for lp in self._loop_writers if lp.is_closed()]:
                    self._loop_writers.pop(old).finish(0)  # it exits once it has committed
                writer = self._loop_writers[loop] = LoopWriter(self._db.path, self.display,
                                                               loop)
            return writer

    def _check_writable(self) -> None:
        if self.read_only:
            raise TraceStoreError(f"the trace store for {self.display} was opened read-only",
                                  hint="open it with read_only=False to write")
        if self._closed:
            raise TraceStoreError(f"the trace store for {self.display} is closed")

    def _submit(self, session: SessionTrace, future: Any = None
                ) -> concurrent.futures.Future[None]:
        """Queue ``session``; ``future``: a concurrent future, or (loop, asyncio future)."""
        if future is None:
            future = concurrent.futures.Future()
        # Checked under the lock `close` holds while it queues the stop marker, so a write
        # is either queued ahead of the marker (and committed) or refused here at once.
        with self._writer_lock:
            self._check_writable()
            if self._writer is None:
                self._writer = threading.Thread(target=self._run_writer, daemon=True,
                                                name="synth-deploy-trace-writer")
                self._writer.start()
            self._queue.put((session, future))
        return future

    def _run_writer(self) -> None:
        # Once started, the writer owns closing the database: `close` may stop waiting for a
        # slow commit, and the batches still queued must not meet a closed connection.
        try:
            self._write_loop()
        finally:
            self._db.close()

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            batch, stop = take_batch(self._queue, item, MAX_BATCH, _STOP)
            self._commit(batch)
            if stop:
                return

    def _commit(self, batch: list[tuple[SessionTrace, concurrent.futures.Future[None]]]) -> None:
        repeats: list[tuple[SessionTrace, concurrent.futures.Future[None]]] = []
        try:
            batch, repeats = self._without_stored(batch)
            if batch:
                self._db.insert_sessions([s for s, _ in batch])
        except Exception as exc:
            if len(batch) + len(repeats) == 1:
                _settle((batch or repeats)[0][1], exc)
                return
            # One bad session must not fail the others: retry them one by one.
            for session, future in batch + repeats:
                self._commit([(session, future)])
            return
        _settle_all([(future, None) for _, future in batch])
        if repeats:  # the same id twice in one batch: compared once the first is stored
            self._commit(repeats)

    def _without_stored(self, batch: list[tuple[SessionTrace, concurrent.futures.Future[None]]]
                        ) -> tuple[list[Any], list[Any]]:
        """``batch`` less the sessions already stored, and the ids repeated in the batch.

        Storing a session that is already there is idempotent: the same content settles its
        write at once (a smoke run that stores what the app's own server stored), other
        content is a `SessionConflictError`.
        """
        ids = list(dict.fromkeys(s.session_id for s, _ in batch))
        # One statement text for every batch size (SQLite keeps it prepared).
        stored = {r["session_id"] for r in self._db.query(
            "SELECT session_id FROM session_traces WHERE session_id IN "
            "(SELECT value FROM json_each(?))", (json.dumps(ids),))}
        fresh, repeats, seen = [], [], set()
        for session, future in batch:
            sid = session.session_id
            if sid in seen:
                repeats.append((session, future))
            elif sid in stored:
                _settle(future, None if self._same_as_stored(session) else SessionConflictError(
                    f"session {sid} is already in {self.display} with different content; "
                    "nothing was written",
                    hint="each rollout needs its own session id"))
            else:
                seen.add(sid)
                fresh.append((session, future))
        return fresh, repeats

    def _same_as_stored(self, session: SessionTrace) -> bool:
        stored = self._session_rows(session.session_id)
        return stored is not None and \
            _rows.insert_statements([stored]) == _rows.insert_statements([session])

    # -- reads ----------------------------------------------------------------------------

    def count_sessions(self, *, app: str | None = None, status: str | None = None) -> int:
        """How many sessions are stored (those of ``app`` with ``status``, when given)."""
        where, params = _filters(self._fields, app=app, status=status)
        return int(self._db.query(f"SELECT COUNT(*) AS n FROM session_traces s{where}",
                                  params)[0]["n"])

    def list_sessions(self, *, limit: int | None = 20, app: str | None = None,
                      status: str | None = None, since: str | None = None,
                      min_reward: float | None = None, model: str | None = None,
                      newest_first: bool = True) -> list[SessionSummary]:
        """Sessions matching the filters (``since``: a timestamp as `_rows.iso` writes)."""
        where, params = _filters(self._fields, app=app, status=status, since=since,
                                 min_reward=min_reward, model=model)
        f = self._fields
        sql = (f"SELECT s.session_id, s.created_at, {f['app_id']} AS app_id, {f['run_id']} AS "
               f"run_id, {f['seed']} AS seed, {f['model_name']} AS model_name, {f['status']} "
               f"AS status, {f['total_reward']} AS total_reward, s.num_timesteps, s.num_events, "
               f"s.num_messages FROM session_traces s{where} "
               f"ORDER BY s.created_at {'DESC' if newest_first else 'ASC'}, s.session_id")
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [SessionSummary(
            session_id=r["session_id"], created_at=str(r["created_at"]), app_id=r["app_id"],
            run_id=r["run_id"], seed=r["seed"], model=r["model_name"], status=r["status"],
            total_reward=r["total_reward"], num_timesteps=r["num_timesteps"],
            num_events=r["num_events"], num_messages=r["num_messages"])
            for r in self._db.query(sql, params)]

    def get_session(self, session_id: str) -> SessionTrace:
        """The stored session with this id, or the one id that starts with it."""
        rows = self._db.query("SELECT * FROM session_traces WHERE session_id = ?",
                              (session_id,))
        if not rows:
            rows = self._prefixed(session_id)
            if len(rows) > 1:
                raise SessionNotFoundError(f"{session_id!r} matches several sessions",
                                           hint="give more characters of the id")
        if not rows:
            raise SessionNotFoundError(f"no session {session_id!r} in {self.display}",
                                       hint="list them with `synth-deploy traces ls`")
        return self._build(rows[0])

    def _prefixed(self, prefix: str) -> list[dict[str, Any]]:
        # A range seek on the primary key (LIKE would read every row of a big store); as
        # typed, then in lower and upper case, as LIKE matched any case.
        for text in dict.fromkeys((prefix, prefix.lower(), prefix.upper())):
            if not text:
                continue
            rows = self._db.query(
                "SELECT * FROM session_traces WHERE session_id >= ? AND session_id < ? "
                "LIMIT 2", (text, text[:-1] + chr(ord(text[-1]) + 1)))
            if rows:
                return rows
        return []

    def _session_rows(self, session_id: str) -> SessionTrace | None:
        rows = self._db.query("SELECT * FROM session_traces WHERE session_id = ?",
                              (session_id,))
        return self._build(rows[0]) if rows else None

    def _build(self, row: dict[str, Any]) -> SessionTrace:
        sid = row["session_id"]
        q = self._db.query
        return _rows.build_session(
            row,
            q("SELECT * FROM session_timesteps WHERE session_id = ?", (sid,)),
            q("SELECT * FROM events WHERE session_id = ?", (sid,)),
            q("SELECT * FROM messages WHERE session_id = ?", (sid,)),
            q("SELECT * FROM outcome_rewards WHERE session_id = ?", (sid,)),
            q("SELECT * FROM event_rewards WHERE session_id = ?", (sid,)))

    def stats(self) -> TraceStats:
        """Counts, tokens and cost, overall and per app and model.

        Read from the running totals (see `_totals`): a few small rows
        whatever the store's size. Older files opened read-only are summed from their rows.
        """
        q = self._db.query
        groups = q(_totals.session_groups(self._fields, self.schema_version))
        models = q(_totals.model_groups(self.schema_version))
        apps: dict[Any, dict[str, Any]] = {}
        for g in groups:
            app = apps.setdefault(g["app_id"], {"app_id": g["app_id"], "sessions": 0,
                                                "errors": 0, "reward_sum": 0.0, "rewards": 0})
            app["sessions"] += g["sessions"]
            app["errors"] += g["sessions"] if g["status"] == "error" else 0
            app["reward_sum"] += g["reward_sum"] or 0.0
            app["rewards"] += g["rewards"] or 0
        by_app = sorted(({"app_id": a["app_id"], "sessions": a["sessions"], "errors": a["errors"],
                          "mean_reward": a["reward_sum"] / a["rewards"] if a["rewards"] else None}
                         for a in apps.values()), key=lambda a: -a["sessions"])
        by_model = sorted(({"model": m["model"], "lm_calls": m["lm_calls"],
                            "input_tokens": m["input_tokens"], "output_tokens": m["output_tokens"],
                            "mean_latency_ms": m["latency_sum"] / m["latencies"]
                            if m["latencies"] else None} for m in models),
                          key=lambda m: -m["lm_calls"])
        cost = float(sum(m["cost_usd"] or 0.0 for m in models))
        # Two index seeks (one aggregate each, so SQLite can use its min/max shortcut).
        first = q("SELECT MIN(created_at) AS v FROM session_traces")[0]["v"]
        last = q("SELECT MAX(created_at) AS v FROM session_traces")[0]["v"]
        return TraceStats(
            sessions=sum(g["sessions"] for g in groups),
            ok=sum(g["sessions"] for g in groups if g["status"] == "ok"),
            errors=sum(a["errors"] for a in by_app),
            timesteps=sum(g["timesteps"] or 0 for g in groups),
            events=sum(g["events"] or 0 for g in groups),
            messages=sum(g["messages"] or 0 for g in groups),
            lm_calls=sum(m["lm_calls"] for m in models),
            input_tokens=sum(m["input_tokens"] or 0 for m in models),
            output_tokens=sum(m["output_tokens"] or 0 for m in models),
            cost_usd=cost, first_at=first, last_at=last, by_app=by_app, by_model=by_model,
            ledger=_totals.ledger(groups, models, cost)
            if self.schema_version >= _totals.TOTALS_VERSION else stored_ledger(q, cost))

    def table_counts(self) -> dict[str, int]:
        tables = ("session_traces", "session_timesteps", "events", "messages",
                  "outcome_rewards", "event_rewards")
        row = self._db.query("SELECT " + ", ".join(
            f"(SELECT COUNT(*) FROM {t}) AS {t}" for t in tables))[0]
        return {t: int(row[t]) for t in tables}

    def integrity_check(self) -> str:
        return str(self._db.query("PRAGMA integrity_check")[0].get("integrity_check", "?"))

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Commit what is queued, stop the writer, close the connection.

        Waits up to ``write_timeout_s`` for queued writes; if they take longer, the writer
        thread (or process) finishes them and closes the connection itself.
        """
        with self._writer_lock:
            if self._closed:
                return
            self._closed = True
            writer = self._writer
            if writer is not None:
                self._queue.put(_STOP)
            loop_writers = list(self._loop_writers.values())
            self._loop_writers.clear()
        for child in loop_writers:
            child.finish(self.write_timeout_s)
        if writer is None:
            self._db.close()
        else:
            writer.join(self.write_timeout_s)

    def __enter__(self) -> TraceStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TraceStore({self.display!r}, schema_version={self.schema_version})"


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


def since_timestamp(text: str, *, now: float | None = None) -> str:
    """``--since`` → stored timestamp text: ``30m``/``24h``/``7d`` ago, or an ISO date/time."""
    from synth_deploy.errors import UsageError

    value = text.strip()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    if value[-1:].lower() in units and value[:-1].replace(".", "", 1).isdigit():
        seconds = float(value[:-1]) * units[value[-1].lower()]
        return _rows.iso((now if now is not None else time.time()) - seconds) or ""
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"cannot read --since {text!r}",
                         hint="use 30m, 24h, 7d, 2025-01-31 or 2025-01-31T12:00") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return _rows.iso(parsed.timestamp()) or ""


def _filters(fields: dict[str, str], **given: Any) -> tuple[str, list[Any]]:
    clauses, params = [], []
    if given.get("app"):
        clauses.append(f"{fields['app_id']} = ?")
        params.append(given["app"])
    if given.get("status"):
        clauses.append(f"{fields['status']} = ?")
        params.append(given["status"])
    if given.get("since"):
        # synth-ai writes ISO text with a "T" (ours has a space), which sorts after ours on
        # the same day: such rows are compared in their own spelling.
        clauses.append("s.created_at >= ? AND (substr(s.created_at, 11, 1) != 'T' OR "
                       "s.created_at >= ?)")
        params += [given["since"], given["since"].replace(" ", "T", 1)]
    if given.get("min_reward") is not None:
        clauses.append(f"{fields['total_reward']} >= ?")
        params.append(float(given["min_reward"]))
    if given.get("model"):
        clauses.append(f"({fields['model_name']} = ? OR EXISTS (SELECT 1 FROM events e WHERE "
                       "e.session_id = s.session_id AND e.model_name = ?))")
        params += [given["model"], given["model"]]
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), params


def _settle(future: Any, exc: BaseException | None) -> None:
    _settle_all([(future, exc)])


def _settle_all(pairs: list[tuple[Any, BaseException | None]]) -> None:
    """Settle concurrent futures here, and each loop's futures with one call into it."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Any, BaseException | None]]] = {}
    for future, exc in pairs:
        if isinstance(future, tuple):
            loop, waiter = future
            by_loop.setdefault(loop, []).append((waiter, exc))
        elif future.set_running_or_notify_cancel():
            if exc is None:
                future.set_result(None)
            else:
                future.set_exception(exc)
    for loop, waiters in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle_in_loop, waiters)
        except RuntimeError:
            pass  # the loop is closed: nobody waits for these any more


def _settle_in_loop(waiters: list[tuple[asyncio.Future[None], BaseException | None]]) -> None:
    for waiter, exc in waiters:
        if not waiter.done():  # a waiter that timed out was cancelled
            if exc is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(exc)


__all__ = ["SessionSummary", "TraceStats", "TraceStore", "open_trace_store", "since_timestamp"]
