"""`TraceStore`: durable writes of finished rollouts and the reads the CLI needs.

Writes go through one writer thread per store. Sessions that arrive while a commit is in
progress are committed together in the next transaction (group commit), so many concurrent
rollouts cost one fsync (or one remote round trip series) per batch instead of one each, and
there is exactly one writer, so "database is locked" cannot happen inside a process.
`write_session` returns only after the COMMIT of its batch: a 200 means the trace is on disk.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from synth_deploy.errors import TraceStoreError
from synth_deploy.tracing import _rows
from synth_deploy.tracing import _schema as schema
from synth_deploy.tracing._config import TraceDbSetting, parse_trace_db
from synth_deploy.tracing._errors import SchemaTooNewError, SessionNotFoundError
from synth_deploy.tracing._session import SessionTrace

MAX_BATCH = 64
WRITE_TIMEOUT_S = 60.0
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

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class TraceStore:
    """A trace database (embedded SQLite file or remote libSQL), schema ensured on open.

    Use `open_trace_store` to get one. Thread- and coroutine-safe; close it (or use it as a
    context manager) to flush pending writes and stop its writer thread. A write that does not
    commit within ``write_timeout_s`` raises `TraceStoreError`.
    """

    def __init__(self, setting: TraceDbSetting, *, create: bool = True,
                 write_timeout_s: float = WRITE_TIMEOUT_S,
                 connect_timeout_s: float | None = None) -> None:
        self.setting = setting
        self.write_timeout_s = write_timeout_s
        if setting.is_remote:
            from synth_deploy.tracing._libsql import LibsqlBackend

            bound = {} if connect_timeout_s is None else {"connect_timeout_s": connect_timeout_s}
            self._db: Any = LibsqlBackend(setting.remote_url or setting.url,
                                          setting.auth_token, display=setting.display, **bound)
        else:
            from synth_deploy.tracing._sqlite import SqliteBackend

            self._db = SqliteBackend(setting.path or setting.url, create=create)
        self._queue: queue.Queue[Any] = queue.Queue()
        self._writer: threading.Thread | None = None
        self._writer_lock = threading.Lock()
        self._closed = False
        try:
            self.schema_version = self._ensure_schema()
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
        if hasattr(self._db, "activate"):
            self._db.activate()
        if current == schema.SCHEMA_VERSION:
            return current

        def columns(table: str) -> set[str]:
            return {r["name"] for r in self._db.query(f"PRAGMA table_info({table})")}

        now = _rows.iso(time.time()) or ""
        statements = [s for _, _, stmts in schema.migration_plan(current, columns, now)
                      for s in stmts]
        try:
            self._db.run(statements)
        except TraceStoreError:
            # Another process may have migrated first; only its result counts.
            if self._version() != schema.SCHEMA_VERSION:
                raise
        return schema.SCHEMA_VERSION

    # -- writes ---------------------------------------------------------------------------

    async def write_session(self, session: SessionTrace) -> None:
        """Store ``session``; returns once it is committed. Safe from many coroutines."""
        future = self._submit(session)
        try:
            await asyncio.wait_for(asyncio.wrap_future(future), self.write_timeout_s)
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

    def _submit(self, session: SessionTrace) -> concurrent.futures.Future[None]:
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        # Checked under the lock `close` holds while it queues the stop marker, so a write
        # is either queued ahead of the marker (and committed) or refused here at once.
        with self._writer_lock:
            if self._closed:
                raise TraceStoreError(f"the trace store for {self.display} is closed")
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
            batch = [item]
            stop = False
            while len(batch) < MAX_BATCH:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is _STOP:
                    stop = True
                    break
                batch.append(more)
            self._commit(batch)
            if stop:
                return

    def _commit(self, batch: list[tuple[SessionTrace, concurrent.futures.Future[None]]]) -> None:
        try:
            self._db.run(_rows.insert_statements([s for s, _ in batch]))
        except Exception as exc:
            if len(batch) == 1:
                _settle(batch[0][1], exc)
                return
            # One bad session must not fail the others: retry them one by one.
            for session, future in batch:
                self._commit([(session, future)])
            return
        for _, future in batch:
            _settle(future, None)

    # -- reads ----------------------------------------------------------------------------

    def count_sessions(self) -> int:
        return int(self._db.query("SELECT COUNT(*) AS n FROM session_traces")[0]["n"])

    def list_sessions(self, *, limit: int | None = 20, app: str | None = None,
                      status: str | None = None, since: str | None = None,
                      min_reward: float | None = None, model: str | None = None,
                      newest_first: bool = True) -> list[SessionSummary]:
        """Sessions matching the filters (``since``: a timestamp as `_rows.iso` writes)."""
        where, params = _filters(app=app, status=status, since=since, min_reward=min_reward,
                                 model=model)
        sql = ("SELECT session_id, created_at, app_id, run_id, seed, model_name, status, "
               "total_reward, num_timesteps, num_events, num_messages FROM session_traces s"
               f"{where} ORDER BY created_at {'DESC' if newest_first else 'ASC'}, session_id")
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
            rows = self._db.query("SELECT * FROM session_traces WHERE session_id LIKE ? "
                                  "ESCAPE '\\' LIMIT 3", (_like_prefix(session_id),))
            if len(rows) > 1:
                raise SessionNotFoundError(f"{session_id!r} matches several sessions",
                                           hint="give more characters of the id")
        if not rows:
            raise SessionNotFoundError(f"no session {session_id!r} in {self.display}",
                                       hint="list them with `synth-deploy traces ls`")
        sid = rows[0]["session_id"]
        q = self._db.query
        return _rows.build_session(
            rows[0],
            q("SELECT * FROM session_timesteps WHERE session_id = ?", (sid,)),
            q("SELECT * FROM events WHERE session_id = ?", (sid,)),
            q("SELECT * FROM messages WHERE session_id = ?", (sid,)),
            q("SELECT * FROM outcome_rewards WHERE session_id = ?", (sid,)),
            q("SELECT * FROM event_rewards WHERE session_id = ?", (sid,)))

    def stats(self) -> TraceStats:
        """Counts, tokens and cost, overall and per app and model."""
        q = self._db.query
        s = q("SELECT COUNT(*) AS n, SUM(status = 'ok') AS ok, SUM(status = 'error') AS err, "
              "SUM(num_timesteps) AS steps, SUM(num_messages) AS msgs, MIN(created_at) AS "
              "first, MAX(created_at) AS last FROM session_traces")[0]
        e = q("SELECT COUNT(*) AS n, SUM(event_type = 'cais') AS lm, "
              "SUM(input_tokens) AS tin, SUM(output_tokens) AS tout, SUM(cost_usd) AS cost "
              "FROM events")[0]
        by_app = q("SELECT app_id, COUNT(*) AS sessions, SUM(status = 'error') AS errors, "
                   "AVG(total_reward) AS mean_reward FROM session_traces GROUP BY app_id "
                   "ORDER BY sessions DESC")
        by_model = q("SELECT model_name AS model, COUNT(*) AS lm_calls, SUM(input_tokens) AS "
                     "input_tokens, SUM(output_tokens) AS output_tokens, AVG(latency_ms) AS "
                     "mean_latency_ms FROM events WHERE event_type = 'cais' GROUP BY "
                     "model_name ORDER BY lm_calls DESC")
        return TraceStats(
            sessions=s["n"] or 0, ok=s["ok"] or 0, errors=s["err"] or 0,
            timesteps=s["steps"] or 0, events=e["n"] or 0, messages=s["msgs"] or 0,
            lm_calls=e["lm"] or 0, input_tokens=e["tin"] or 0, output_tokens=e["tout"] or 0,
            cost_usd=float(e["cost"] or 0.0), first_at=s["first"], last_at=s["last"],
            by_app=by_app, by_model=by_model)

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
        thread finishes them and closes the connection itself.
        """
        with self._writer_lock:
            if self._closed:
                return
            self._closed = True
            writer = self._writer
            if writer is not None:
                self._queue.put(_STOP)
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
                     create: bool = True) -> TraceStore:
    """Open (creating and migrating as needed) the trace database ``setting`` names.

    ``setting`` is what `resolve_trace_db` resolved at the entry point; a plain path or URL
    is parsed as given (a remote token must then be in the URL). With ``create=False`` a
    missing local file is an error instead of being created (what read-only commands want).
    Raises `TraceStoreError` (with a hint) for bad URLs, corrupt or foreign files, newer
    schemas, read-only folders and unreachable servers; nothing is overwritten.
    """
    if not isinstance(setting, TraceDbSetting):
        setting = parse_trace_db(os.fspath(setting))
    return TraceStore(setting, create=create)


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


def _filters(**given: Any) -> tuple[str, list[Any]]:
    clauses, params = [], []
    if given.get("app"):
        clauses.append("s.app_id = ?")
        params.append(given["app"])
    if given.get("status"):
        clauses.append("s.status = ?")
        params.append(given["status"])
    if given.get("since"):
        clauses.append("s.created_at >= ?")
        params.append(given["since"])
    if given.get("min_reward") is not None:
        clauses.append("s.total_reward >= ?")
        params.append(float(given["min_reward"]))
    if given.get("model"):
        clauses.append("(s.model_name = ? OR EXISTS (SELECT 1 FROM events e WHERE "
                       "e.session_id = s.session_id AND e.model_name = ?))")
        params += [given["model"], given["model"]]
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), params


def _like_prefix(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _settle(future: concurrent.futures.Future[None], exc: BaseException | None) -> None:
    if future.set_running_or_notify_cancel():
        if exc is None:
            future.set_result(None)
        else:
            future.set_exception(exc)


__all__ = ["SessionSummary", "TraceStats", "TraceStore", "open_trace_store", "since_timestamp"]
