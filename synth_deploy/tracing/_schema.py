"""The v3 trace schema (shared/spec/tracing-v3.md), its version table and migrations.

Version 1 is the layout synth-ai's tracing v3 writes (no version table: recognised by its
``session_traces`` table). Version 2 adds ``synth_deploy_schema``, denormalised columns on
``session_traces`` (app, run, status, model, seed, reward) backfilled from the metadata JSON,
stable ids for events and messages, and the indexes `traces ls/export` filter on.

Migrations are plain statement lists run in one transaction by the store's backend, so an
interrupted migration leaves the previous version intact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

SCHEMA_VERSION = 2
VERSION_TABLE = "synth_deploy_schema"
Statement = tuple[str, tuple[Any, ...]]

_V1_TABLES = (
    """CREATE TABLE IF NOT EXISTS experiments (
        experiment_id VARCHAR PRIMARY KEY, name VARCHAR NOT NULL, description TEXT,
        created_at DATETIME DEFAULT CURRENT_TIMESTAMP, updated_at DATETIME DEFAULT
        CURRENT_TIMESTAMP, configuration TEXT, metadata TEXT)""",
    """CREATE TABLE IF NOT EXISTS systems (
        system_id VARCHAR PRIMARY KEY, name VARCHAR NOT NULL, system_type VARCHAR,
        description TEXT, created_at DATETIME DEFAULT CURRENT_TIMESTAMP, metadata TEXT)""",
    """CREATE TABLE IF NOT EXISTS system_versions (
        version_id VARCHAR PRIMARY KEY, system_id VARCHAR NOT NULL,
        version_number VARCHAR NOT NULL, commit_hash VARCHAR,
        created_at DATETIME DEFAULT CURRENT_TIMESTAMP, configuration TEXT, metadata TEXT,
        UNIQUE (system_id, version_number))""",
    """CREATE TABLE IF NOT EXISTS experimental_systems (
        id INTEGER PRIMARY KEY AUTOINCREMENT, experiment_id VARCHAR NOT NULL,
        system_id VARCHAR NOT NULL, version_id VARCHAR NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS session_traces (
        session_id VARCHAR PRIMARY KEY, created_at DATETIME NOT NULL,
        num_timesteps INTEGER NOT NULL, num_events INTEGER NOT NULL,
        num_messages INTEGER NOT NULL, metadata TEXT, experiment_id VARCHAR)""",
    """CREATE TABLE IF NOT EXISTS session_timesteps (
        id INTEGER PRIMARY KEY AUTOINCREMENT, session_id VARCHAR NOT NULL,
        step_id VARCHAR NOT NULL, step_index INTEGER NOT NULL, turn_number INTEGER,
        started_at DATETIME, completed_at DATETIME, num_events INTEGER, num_messages INTEGER,
        step_metadata TEXT, UNIQUE (session_id, step_id))""",
    """CREATE TABLE IF NOT EXISTS events (
        id INTEGER PRIMARY KEY AUTOINCREMENT, session_id VARCHAR NOT NULL,
        timestep_id INTEGER, event_type VARCHAR NOT NULL, system_instance_id VARCHAR,
        event_time FLOAT, message_time INTEGER, created_at DATETIME, model_name VARCHAR,
        provider VARCHAR, input_tokens INTEGER, output_tokens INTEGER, total_tokens INTEGER,
        cost_usd FLOAT, latency_ms FLOAT, span_id VARCHAR, trace_id VARCHAR,
        call_records TEXT, reward FLOAT, terminated BOOLEAN, truncated BOOLEAN,
        system_state_before TEXT, system_state_after TEXT, metadata TEXT,
        event_metadata TEXT)""",
    """CREATE TABLE IF NOT EXISTS messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT, session_id VARCHAR NOT NULL,
        timestep_id INTEGER, message_type VARCHAR NOT NULL, content TEXT,
        timestamp DATETIME, event_time FLOAT, message_time INTEGER, metadata TEXT)""",
    """CREATE TABLE IF NOT EXISTS outcome_rewards (
        id INTEGER PRIMARY KEY AUTOINCREMENT, session_id VARCHAR NOT NULL,
        total_reward FLOAT NOT NULL, achievements_count INTEGER NOT NULL,
        total_steps INTEGER NOT NULL, created_at DATETIME NOT NULL, reward_metadata TEXT)""",
    """CREATE TABLE IF NOT EXISTS event_rewards (
        id INTEGER PRIMARY KEY AUTOINCREMENT, event_id INTEGER, session_id VARCHAR NOT NULL,
        message_id INTEGER, turn_number INTEGER, reward_value FLOAT NOT NULL,
        reward_type VARCHAR, "key" VARCHAR, annotation TEXT, source VARCHAR,
        created_at DATETIME NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS idx_session_created ON session_traces (created_at)",
    "CREATE INDEX IF NOT EXISTS idx_event_session_step ON events (session_id, timestep_id)",
    "CREATE INDEX IF NOT EXISTS idx_message_session_step ON messages (session_id, timestep_id)",
    "CREATE INDEX IF NOT EXISTS idx_outcome_rewards_session ON outcome_rewards (session_id)",
    "CREATE INDEX IF NOT EXISTS idx_event_rewards_session ON event_rewards (session_id)",
)

# (table, column, type) added by version 2; skipped when a column already exists.
V2_COLUMNS = (
    ("session_traces", "app_id", "VARCHAR"),
    ("session_traces", "run_id", "VARCHAR"),
    ("session_traces", "status", "VARCHAR"),
    ("session_traces", "model_name", "VARCHAR"),
    ("session_traces", "seed", "INTEGER"),
    ("session_traces", "total_reward", "FLOAT"),
    ("events", "event_uid", "VARCHAR"),
    ("messages", "message_uid", "VARCHAR"),
    ("outcome_rewards", "annotation", "TEXT"),
)

_V2_AFTER_COLUMNS = (
    f"""CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (
        version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL, description TEXT NOT NULL)""",
    # Backfill what synth-ai kept only inside the metadata JSON.
    """UPDATE session_traces SET
        app_id = COALESCE(app_id, json_extract(metadata, '$.app_id'),
                          json_extract(metadata, '$.env_name')),
        run_id = COALESCE(run_id, json_extract(metadata, '$.run_id')),
        status = COALESCE(status, json_extract(metadata, '$.status'), 'ok'),
        model_name = COALESCE(model_name, json_extract(metadata, '$.model')),
        seed = COALESCE(seed, json_extract(metadata, '$.seed')),
        total_reward = COALESCE(total_reward,
            (SELECT o.total_reward FROM outcome_rewards o
              WHERE o.session_id = session_traces.session_id ORDER BY o.id DESC LIMIT 1),
            json_extract(metadata, '$.metrics.outcome_reward'))
      WHERE json_valid(COALESCE(metadata, '{}'))""",
    "CREATE INDEX IF NOT EXISTS idx_session_app_created ON session_traces (app_id, created_at)",
    "CREATE INDEX IF NOT EXISTS idx_session_run ON session_traces (run_id)",
    "CREATE INDEX IF NOT EXISTS idx_session_reward ON session_traces (total_reward)",
    "CREATE INDEX IF NOT EXISTS idx_session_model ON session_traces (model_name)",
    "CREATE UNIQUE INDEX IF NOT EXISTS uq_event_uid ON events (event_uid)",
    "CREATE UNIQUE INDEX IF NOT EXISTS uq_message_uid ON messages (message_uid)",
    "CREATE INDEX IF NOT EXISTS idx_event_model ON events (model_name)",
)


def detect_version(tables: Sequence[str], versions: Sequence[int]) -> int | None:
    """0 for an empty database, 1 for synth-ai's layout, N from the version table; None when
    the database holds tables that are not a trace store."""
    names = {t for t in tables if not t.startswith("sqlite_")}
    if VERSION_TABLE in names:
        return max(versions, default=1)
    if "session_traces" in names:
        return 1
    return 0 if not names else None


def migration_plan(current: int, columns: Callable[[str], set[str]],
                   now: str) -> list[tuple[int, str, list[Statement]]]:
    """The steps from ``current`` to `SCHEMA_VERSION`: (version, description, statements).

    ``columns(table)`` reports a table's existing columns, so ADD COLUMN is never repeated
    on databases that already have some of them.
    """
    steps: list[tuple[int, str, list[Statement]]] = []
    if current < 1:
        steps.append((1, "synth-ai tracing v3 tables", [(sql, ()) for sql in _V1_TABLES]))
    if current < 2:
        stmts: list[Statement] = []
        have: dict[str, set[str]] = {}
        for table, column, kind in V2_COLUMNS:
            existing = have.setdefault(table, columns(table) if current >= 1 else set())
            if column not in existing:
                stmts.append((f"ALTER TABLE {table} ADD COLUMN {column} {kind}", ()))
        stmts += [(sql, ()) for sql in _V2_AFTER_COLUMNS]
        steps.append((2, "version table, session columns, stable event/message ids, indexes",
                      stmts))
    for version, description, stmts in steps:
        if version >= 2:
            stmts.append((f"INSERT OR IGNORE INTO {VERSION_TABLE} (version, applied_at, "
                          "description) VALUES (?, ?, ?)", (version, now, description)))
    return steps


__all__ = ["SCHEMA_VERSION", "V2_COLUMNS", "VERSION_TABLE", "detect_version", "migration_plan"]
