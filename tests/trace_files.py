"""Trace database files for the tracing tests: states the store must refuse, and the layout
synth-ai's tracer leaves."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path

from synth_deploy.tracing import SCHEMA_VERSION, TraceStore, open_trace_store


def make_schema_too_new(path: Path) -> None:
    """A trace file whose schema version is one past what this code knows, checkpointed so
    its bytes on disk are final (tests compare hashes before and after)."""
    with open_trace_store(str(path)):
        pass
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO synth_deploy_schema VALUES (?, 'x', 'from the future')",
                 (SCHEMA_VERSION + 1,))
    conn.commit()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


SYNTH_AI_V1 = [
    "CREATE TABLE session_traces (session_id VARCHAR PRIMARY KEY, created_at DATETIME NOT "
    "NULL, num_timesteps INTEGER NOT NULL, num_events INTEGER NOT NULL, num_messages INTEGER "
    "NOT NULL, metadata TEXT, experiment_id VARCHAR, embedding VECTOR)",
    "CREATE TABLE session_timesteps (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id VARCHAR "
    "NOT NULL, step_id VARCHAR NOT NULL, step_index INTEGER NOT NULL, turn_number INTEGER, "
    "started_at DATETIME, completed_at DATETIME, num_events INTEGER, num_messages INTEGER, "
    "step_metadata TEXT, UNIQUE(session_id, step_id))",
    "CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id VARCHAR NOT NULL, "
    "timestep_id INTEGER, event_type VARCHAR NOT NULL, system_instance_id VARCHAR, event_time "
    "FLOAT, message_time INTEGER, created_at DATETIME, model_name VARCHAR, provider VARCHAR, "
    "input_tokens INTEGER, output_tokens INTEGER, total_tokens INTEGER, cost_usd INTEGER, "
    "latency_ms INTEGER, span_id VARCHAR, trace_id VARCHAR, call_records TEXT, reward FLOAT, "
    "terminated BOOLEAN, truncated BOOLEAN, system_state_before TEXT, system_state_after "
    "TEXT, metadata TEXT, event_metadata TEXT, embedding VECTOR)",
    "CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id VARCHAR NOT "
    "NULL, timestep_id INTEGER, message_type VARCHAR NOT NULL, content TEXT NOT NULL, "
    "timestamp DATETIME, event_time FLOAT, message_time INTEGER, metadata TEXT, embedding "
    "VECTOR)",
    "CREATE TABLE outcome_rewards (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id VARCHAR "
    "NOT NULL, total_reward INTEGER NOT NULL, achievements_count INTEGER NOT NULL, "
    "total_steps INTEGER NOT NULL, created_at DATETIME NOT NULL, reward_metadata TEXT)",
    "CREATE TABLE event_rewards (id INTEGER PRIMARY KEY AUTOINCREMENT, event_id INTEGER NOT "
    "NULL, session_id VARCHAR NOT NULL, message_id INTEGER, turn_number INTEGER, reward_value "
    "FLOAT NOT NULL, reward_type VARCHAR, \"key\" VARCHAR, annotation TEXT, source VARCHAR, "
    "created_at DATETIME NOT NULL)",
]


def make_synth_ai_db(path: Path) -> None:
    """A database as synth-ai's tracing v3 left it: no version table, ids autoincremented."""
    conn = sqlite3.connect(path)
    for sql in SYNTH_AI_V1:
        conn.execute(sql)
    meta = json.dumps({"env_name": "crafter", "run_id": "old-1", "seed": 4, "model": "qwen",
                       "metrics": {"outcome_reward": 0.25}})
    conn.execute("INSERT INTO session_traces VALUES ('old-session', '2024-05-01 10:00:00', 1, "
                 "1, 2, ?, NULL, NULL)", (meta,))
    conn.execute("INSERT INTO session_timesteps VALUES (1, 'old-session', 's0', 0, 1, "
                 "'2024-05-01 10:00:00', NULL, 1, 2, '{}')")
    conn.execute("INSERT INTO events (session_id, timestep_id, event_type, system_instance_id,"
                 " event_time, model_name, input_tokens, output_tokens) VALUES ('old-session', "
                 "1, 'cais', 'policy', 1714557600.0, 'qwen', 3, 4)")
    conn.execute("INSERT INTO messages (session_id, timestep_id, message_type, content) VALUES "
                 "('old-session', 1, 'user', 'hi'), ('old-session', 1, 'assistant', 'yo')")
    conn.commit()
    conn.close()


def statements_run(store: TraceStore) -> list[str]:
    """Every SQL statement the store's own connection runs from now on (SQLite's trace hook):
    its reads, and the writes of its writer thread (not those of a writer child). Left out:
    the probe of the writer child's journal each read starts with (one index probe)."""
    seen: list[str] = []

    def heard(sql: str) -> None:
        if not sql.startswith("SELECT EXISTS (SELECT 1 FROM session_journal)"):
            seen.append(sql)

    store.database.trace_statements(heard)
    return seen


async def ready_writer_child(store: TraceStore, timeout_s: float = 15.0):
    """The running loop's writer child, once it has opened the store (until then the
    store's own thread commits)."""
    child = store.use_writer_process()
    deadline = time.monotonic() + timeout_s
    while not child.ready:
        assert time.monotonic() < deadline, "the writer child never became ready"
        await asyncio.sleep(0.01)
    return child
