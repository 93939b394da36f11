"""`TraceDatabase`: one opened trace database, its schema made current or read as it is.

What the store, its writers and its readers share: the backend (a SQLite file in WAL mode,
or a libSQL server through a child process of its own), the schema version, and each
session field as SQL over ``session_traces s`` (a column where the schema keeps it filled,
else derived from the metadata). Opening creates or migrates the schema in one transaction
unless ``read_only``. Reads go through `query` and `rows`; sessions are written by
`insert_sessions`, one transaction a batch: whoever writes (`synth_deploy.tracing._write`)
decides what goes in a batch.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from synth_deploy.errors import TraceStoreError
from synth_deploy.tracing._config import TraceDbSetting
from synth_deploy.tracing._db import _rows
from synth_deploy.tracing._db import _schema as schema
from synth_deploy.tracing._errors import NotATraceDbError, SchemaTooNewError, TraceDbMissingError
from synth_deploy.tracing._session import SessionTrace
from synth_deploy.tracing._times import iso

logger = logging.getLogger("synth_deploy.tracing")
_SESSION_TABLES = ("session_timesteps", "events", "messages", "outcome_rewards",
                   "event_rewards")


class TraceDatabase:
    """An opened trace database (see the module docstring); close it when done.

    ``create=False``: a missing local file is an error instead of being created.
    ``read_only``: nothing is ever changed (no migration, no journal mode switch).
    """

    def __init__(self, setting: TraceDbSetting, *, create: bool = True,
                 read_only: bool = False, connect_timeout_s: float | None = None) -> None:
        self.setting = setting
        self.read_only = read_only
        if setting.is_remote:
            from synth_deploy.tracing._db._libsql import LibsqlBackend

            bound = {} if connect_timeout_s is None else {"connect_timeout_s": connect_timeout_s}
            self._backend: Any = LibsqlBackend(setting.remote_url or setting.url,
                                               setting.auth_token, display=setting.display,
                                               **bound)
        else:
            from synth_deploy.tracing._db._sqlite import SqliteBackend

            self._backend = SqliteBackend(setting.path or setting.url,
                                          create=create and not read_only, read_only=read_only)
        try:
            self.schema_version = self._ensure_schema()
            columns = {r["name"] for r in self.query(
                "SELECT name FROM pragma_table_info('session_traces')")}
            # Each session field as SQL over ``session_traces s``, as this schema allows.
            self.fields: dict[str, str] = schema.session_fields(columns, self.schema_version)
        except BaseException:
            self._backend.close()
            raise

    @property
    def display(self) -> str:
        return self.setting.display

    @property
    def in_memory(self) -> bool:
        return not self.setting.is_remote and str(self.setting.path) == ":memory:"

    # -- statements -----------------------------------------------------------------------

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Rows of a read statement, as dicts by column name."""
        return self._backend.query(sql, params)

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """What `query` reads, as tuples in the statement's column order (for hot loops)."""
        return self._backend.rows(sql, params)

    def run(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> None:
        """Write statements (SQL, parameters) in one transaction: all of them, or none."""
        self._backend.run(statements)

    def insert_sessions(self, sessions: list[SessionTrace]) -> None:
        """Every row of ``sessions`` in one transaction: all of them, or none."""
        self._backend.insert_sessions(sessions)

    def stored_ids(self, ids: Sequence[str]) -> set[str]:
        """Those of ``ids`` that a stored session has."""
        # One statement text for every batch size (SQLite keeps it prepared).
        return {r["session_id"] for r in self.query(
            "SELECT session_id FROM session_traces WHERE session_id IN "
            "(SELECT value FROM json_each(?))", (json.dumps(list(ids)),))}

    def session(self, session_id: str) -> SessionTrace | None:
        """The stored session with exactly this id, or None."""
        rows = self.query("SELECT * FROM session_traces WHERE session_id = ?", (session_id,))
        return self._build(rows[0]) if rows else None

    def sessions_starting_with(self, prefix: str, limit: int = 2) -> list[SessionTrace]:
        """Up to ``limit`` sessions whose id starts with ``prefix`` (as typed, else in lower
        or upper case): a range seek on the key, where LIKE would read every row."""
        for text in dict.fromkeys((prefix, prefix.lower(), prefix.upper())):
            if not text:
                continue
            rows = self.query("SELECT * FROM session_traces WHERE session_id >= ? AND "
                              f"session_id < ? LIMIT {int(limit)}",
                              (text, text[:-1] + chr(ord(text[-1]) + 1)))
            if rows:
                return [self._build(row) for row in rows]
        return []

    def _build(self, row: dict[str, Any]) -> SessionTrace:
        sid = (row["session_id"],)
        parts = [self.query(f"SELECT * FROM {table} WHERE session_id = ?", sid)
                 for table in _SESSION_TABLES]
        if self.schema_version >= schema.TOKENS_VERSION:  # through the events' index
            parts.append(self.query(f"SELECT t.* FROM events e JOIN {schema.TOKENS_TABLE} t "
                                    "ON t.event_id = e.id WHERE e.session_id = ?", sid))
        return _rows.build_session(row, *parts)

    def table_counts(self) -> dict[str, int]:
        tables = ("session_traces", *_SESSION_TABLES)
        row = self.query("SELECT " + ", ".join(
            f"(SELECT COUNT(*) FROM {t}) AS {t}" for t in tables))[0]
        return {t: int(row[t]) for t in tables}

    def integrity_check(self) -> str:
        return str(self.query("PRAGMA integrity_check")[0].get("integrity_check", "?"))

    # -- a local file's upkeep ------------------------------------------------------------

    def checkpoint(self, **knobs: Any) -> str:
        """One round of moving the WAL into the file (see `SqliteBackend.checkpoint`); says
        what it did. A remote database keeps its own log: nothing to do."""
        if self.setting.is_remote or self.in_memory:
            return "none"
        return self._backend.checkpoint(**knobs)

    def checkpoint_in_background(self, **knobs: Any) -> None:
        """`checkpoint` from a thread of its own, every so often, instead of inside the
        commit that crosses SQLite's threshold (what a writer that commits all the time
        wants: see `SqliteBackend.checkpoint_in_background`)."""
        if not (self.setting.is_remote or self.in_memory):
            self._backend.checkpoint_in_background(**knobs)

    def trace_statements(self, callback: Callable[[str], None] | None) -> None:
        """Call ``callback`` with every statement this process's connection runs from now on
        (None stops it): for debugging, and for tests that count statements. SQLite only."""
        if self.setting.is_remote:
            raise TraceStoreError("statements are traced on a local SQLite file only")
        self._backend.trace_statements(callback)

    def close(self) -> None:
        self._backend.close()

    # -- schema ---------------------------------------------------------------------------

    def _version(self) -> int:
        tables = [r["name"] for r in self.query(
            "SELECT name FROM sqlite_master WHERE type = 'table'")]
        versions: list[int] = []
        if schema.VERSION_TABLE in tables:
            versions = [r["version"] for r in self.query(
                f"SELECT version FROM {schema.VERSION_TABLE}")]
        found = schema.detect_version(tables, versions)
        if found is None:
            shown = ", ".join(sorted(t for t in tables if not t.startswith("sqlite_"))[:6])
            raise NotATraceDbError(
                f"{self.display} is a database but not a trace store (tables: {shown}); "
                "it was left untouched",
                hint="point --trace-db / SYNTH_TRACES_DB at a new or existing trace file")
        return found

    def _ensure_schema(self) -> int:
        current = self._version()
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
        if hasattr(self._backend, "activate"):
            self._backend.activate()
        if current == schema.SCHEMA_VERSION:
            return current

        def columns(table: str) -> set[str]:
            return {r["name"] for r in self.query(f"PRAGMA table_info({table})")}

        statements = [s for _, _, stmts in schema.migration_plan(
            current, columns, iso(time.time()) or "") for s in stmts]
        if current >= 1:  # an existing store, maybe a large one: say why opening it waits
            logger.warning("%s: upgrading its trace schema from v%d to v%d, once (it reads "
                           "every session: minutes for millions)", self.display, current,
                           schema.SCHEMA_VERSION)
        try:
            self._backend.run(statements)
        except TraceStoreError:
            # Another process may have migrated first; only its result counts.
            if self._version() != schema.SCHEMA_VERSION:
                raise
        return schema.SCHEMA_VERSION

    def __repr__(self) -> str:
        return f"TraceDatabase({self.display!r}, schema_version={self.schema_version})"


__all__ = ["TraceDatabase"]
