"""The v3 trace schema (shared/spec/tracing-v3.md), its version table and migrations.

Version 1 is the layout synth-ai's tracing v3 writes (no version table: recognised by its
``session_traces`` table). Version 2 adds ``synth_deploy_schema``, denormalised columns on
``session_traces`` (app, run, status, model, seed, reward) backfilled from the metadata JSON,
stable ids for events and messages, and the indexes `traces ls/export` filter on. Version 3
adds triggers that fill those columns for rows another writer adds (synth-ai's tracer keeps
writing into a file we migrated, and knows nothing of them), so reads can trust the columns.
Version 4 indexes what `traces view` filters and summarises on: status, mode and split
(the last two on expressions over the metadata, which serve every writer with no column to
keep filled), and app · model · time with status and reward (every glance aggregate read
from the index alone). Version 5 keeps running totals for `traces stats` (see `_totals`), so
they cost the same at a million sessions as at ten; version 6 adds the events count to them.
Version 7 keeps mode, split and duration as columns too (filled by our writer and, for
other writers' rows, by the version 3 triggers): the expression indexes and the totals
parsed each new session's metadata JSON again and again, and a mode stored as a number
could not be filtered on. Version 8 replaces
the seven per-filter indexes of versions 4 and 7 with one that holds every filter's column
(see `GLANCE_INDEX`), and indexes the run alone again. Version 9 adds `TOKENS_TABLE`, the
ids and log-probabilities of LM calls (`synth_deploy.tracing._tokens`), one row an event.
Version 10 drops the version 3 trigger that copied each new outcome reward into its session
row (see `REWARD_OWNER_VERSION`). Version 11 adds `JOURNAL_TABLE`, where a busy writer child
puts whole sessions before their rows are built (`synth_deploy.tracing._write._journal`),
and `AMENDMENTS_TABLE`, what a lost answer says of a session whose row is not there yet.
Version 12 adds `REWARD_VERSIONS_TABLE`: a session's reward again, as a scorer gave it from
the stored trace (`traces rescore`), one row per session and version beside the original,
which is never rewritten.
Version 13 keys async rollouts' records (``async_rollouts``, until then made when first used,
keyed by rollout id alone) by app and rollout id, with the columns that let servers on one
store share them (a claim's token, the lease's last touch, a stop asked for), and adds
``rollout_runners``, each runner's heartbeat (`synth_deploy.tracing._rollout_records`).

Reads never migrate: a version 1 or 2 file opened read-only is read through
`session_fields`, which derives what its columns lack (or may lack) from the metadata.

Migrations are plain statement lists run in one transaction by the store's backend, so an
interrupted migration leaves the previous version intact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from synth_deploy.tracing._db._columns import METADATA_PATHS
from synth_deploy.tracing._db._totals import migration as totals_migration

SCHEMA_VERSION = 13
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
# Added by version 7 (TEXT and REAL affinity: a number given as a mode is stored as text,
# so `--mode 3` finds it; a duration given as "1.5" is stored as 1.5).
V7_COLUMNS = (
    ("session_traces", "mode", "VARCHAR"),
    ("session_traces", "split", "VARCHAR"),
    ("session_traces", "duration_s", "FLOAT"),
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
    # (It also indexed app · time and the model; version 8's glance index holds both.)
    "CREATE INDEX IF NOT EXISTS idx_session_run ON session_traces (run_id)",
    "CREATE INDEX IF NOT EXISTS idx_session_reward ON session_traces (total_reward)",
    "CREATE UNIQUE INDEX IF NOT EXISTS uq_event_uid ON events (event_uid)",
    "CREATE UNIQUE INDEX IF NOT EXISTS uq_message_uid ON messages (message_uid)",
    "CREATE INDEX IF NOT EXISTS idx_event_model ON events (model_name)",
)




# What each session column holds, derived from the row's metadata JSON and its outcome
# rewards, as SQL over the table (or alias) ``q``. json_valid guards: json_extract raises on
# one malformed text and would fail the whole statement.
def _meta(q: str, path: str) -> str:
    return metadata_field(path, q)


def metadata_field(path: str, q: str | None = None) -> str:
    """SQL for the value at JSON ``path`` in a session's metadata (NULL where the metadata
    is not JSON), over the table aliased ``q``. Spelled the same as the version 4 to 6
    indexes spell it (they take no alias), so SQLite uses them."""
    column = f"{q}.metadata" if q else "metadata"
    return f"json_extract(CASE WHEN json_valid({column}) THEN {column} END, '{path}')"


def _derived(q: str) -> dict[str, str]:
    return {
        "app_id": f"COALESCE({_meta(q, '$.app_id')}, {_meta(q, '$.env_name')})",
        "run_id": _meta(q, "$.run_id"),
        "status": _meta(q, "$.status"),
        "model_name": _meta(q, "$.model"),
        "seed": f"CASE WHEN json_type(CASE WHEN json_valid({q}.metadata) THEN {q}.metadata "
                f"END, '$.seed') = 'integer' THEN {_meta(q, '$.seed')} END",
        "total_reward": f"COALESCE((SELECT o.total_reward FROM outcome_rewards o WHERE "
                        f"o.session_id = {q}.session_id ORDER BY o.id DESC LIMIT 1), "
                        f"{_meta(q, '$.metrics.outcome_reward')})",
        **{name: _meta(q, path) for name, path in METADATA_PATHS.items()},
    }


_V2_FIELDS = ("app_id", "run_id", "status", "model_name", "seed", "total_reward")
SESSION_FIELDS = (*_V2_FIELDS, *METADATA_PATHS)
TRUSTED_COLUMNS_VERSION = 3


def session_fields(columns: set[str], version: int, q: str = "s") -> dict[str, str]:
    """SQL for each of `SESSION_FIELDS` over ``session_traces`` aliased ``q``.

    From version 3 the columns are kept filled (the triggers) and indexed: they are used as
    they are (mode, split and duration from version 7, the first that has them). Older
    files fall back to the metadata for rows whose column is NULL (written by synth-ai
    after a version 2 migration), or entirely (version 1, and version 6 for mode, split and
    duration). A session without a status is one that finished: synth-ai records none.
    """
    fields = {}
    for name, derived in _derived(q).items():
        if name == "status":
            derived = f"COALESCE({derived}, 'ok')"
        if name in columns and version >= TRUSTED_COLUMNS_VERSION:
            fields[name] = f"{q}.{name}"
        elif name in columns:
            fields[name] = f"COALESCE({q}.{name}, {derived})"
        else:
            fields[name] = derived
    return fields


def _fill(q: str, fields: tuple[str, ...], *, metadata_first: bool) -> str:
    derived = _derived(q)
    derived["status"] = f"COALESCE({derived['status']}, 'ok')" if not metadata_first \
        else derived["status"]
    parts = []
    for name in fields:
        if metadata_first and name != "total_reward":
            parts.append(f"{name} = COALESCE({derived[name]}, {name})")
        else:
            parts.append(f"{name} = COALESCE({name}, {derived[name]})")
    return ", ".join(parts)


_T = "session_traces"
_FILL_TRIGGERS = ("synth_deploy_session_added", "synth_deploy_session_metadata")


def _fill_triggers(fields: tuple[str, ...]) -> list[str]:
    # synth-ai inserts a session row with its metadata, then rewrites the metadata when the
    # session ends; our writer inserts rows with the columns set (and a status).
    added, rewritten = _FILL_TRIGGERS
    return [
        f"""CREATE TRIGGER IF NOT EXISTS {added} AFTER INSERT ON {_T}
        WHEN NEW.status IS NULL BEGIN
        UPDATE {_T} SET {_fill(_T, fields, metadata_first=False)}
         WHERE session_id = NEW.session_id;
        END""",
        f"""CREATE TRIGGER IF NOT EXISTS {rewritten} AFTER UPDATE OF metadata ON {_T} BEGIN
        UPDATE {_T} SET {_fill(_T, fields, metadata_first=True)}
         WHERE session_id = NEW.session_id;
        END""",
    ]


_V3_STATEMENTS = (
    # Rows synth-ai wrote since a version 2 migration.
    f"UPDATE {_T} SET {_fill(_T, _V2_FIELDS, metadata_first=False)} WHERE "
    + " OR ".join(f"{name} IS NULL" for name in _V2_FIELDS),
    *_fill_triggers(_V2_FIELDS),
)

# Version 10: the session's reward has one owner. Our writer stores `session_reward` (the
# Python rule) in the session row in the same transaction as the outcome rows, and nothing
# in SQL rewrites it: versions 3 to 9 had a trigger copy every new outcome reward into the
# session row, which silently repaired a reward our writer stored wrong and cost every
# session with two outcome rewards two more row updates (and their totals). Other writers'
# rows (synth-ai records its outcome rewards before `end_session` rewrites the metadata) are
# still filled by the version 3 fill triggers, from `_derived`, when their metadata is
# written; `session_fields` reads files older than version 3 the same way.
REWARD_OWNER_VERSION = 10
_OUTCOME_TRIGGER = "synth_deploy_outcome_added"


# Filters the viewer offers on the metadata: indexed from version 4 (on expressions over the
# metadata), columns from version 7.
FILTERED_METADATA = ("mode", "split")
INDEXED_METADATA_VERSION = 4

# Version 8: one index holds every column the viewer filters and aggregates on, led by time.
# A filtered page walks it newest first; a filtered count, glance or comparison reads it
# alone, not the rows: at most one pass over it per query, which the unfiltered glance
# costs anyway. Versions 4 to 7 kept one such index per filter, seven in all, and each
# rollout's commit rewrote pages of every one of them. The run, unique to a rollout where a
# trainer sets it, gets a narrow index of its own: it is looked up, not aggregated, and its
# inserts land anywhere in the index.
GLANCE_INDEX_VERSION = 8
GLANCE_INDEX = "idx_session_glance"
GLANCE_COLUMNS = ("created_at", "app_id", "model_name", "status", "total_reward", "seed",
                  "mode", "split")
_PER_FILTER_INDEXES = tuple(f"idx_session_{name}_glance" for name in (
    "created", "app", "model", "run", "status", "mode", "split"))
# The narrow indexes the glance index covers: synth-ai's, and two version 2 made.
_NARROW_V2_INDEXES = ("idx_session_created", "idx_session_app_created", "idx_session_model")


def _v8_statements() -> list[str]:
    return [*(f"DROP INDEX IF EXISTS {name}" for name in (*_NARROW_V2_INDEXES,
                                                          *_PER_FILTER_INDEXES)),
            f"CREATE INDEX IF NOT EXISTS {GLANCE_INDEX} ON {_T} ({', '.join(GLANCE_COLUMNS)})",
            f"CREATE INDEX IF NOT EXISTS idx_session_run ON {_T} (run_id)",
            # Rebuilt grouped by every filter too (the filter values come from them), summing
            # wall time from the duration column, with triggers that watch those columns.
            *totals_migration()]


# Version 9: one row per LM call whose tokens were asked for, keyed by its event (read
# through the events' session index, so it needs none of its own). Packed columns (see
# `synth_deploy.tracing._tokens`): a prompt is the count of ids it shares with the previous
# row's prompt and completion (in event order) and the ids after them.
JOURNAL_VERSION = 11
JOURNAL_TABLE = "session_journal"
AMENDMENTS_TABLE = "session_amendments"

TOKENS_VERSION = 9
TOKENS_TABLE = "lm_call_tokens"
TOKENS_COLUMNS = ("event_id", "provenance", "absent_reason", "model", "revision",
                  "prompt_shared", "prompt_rest", "completion_ids", "completion_logprobs",
                  "prompt_count", "completion_count", "diverged_at", "diverged_ids")
_V9_STATEMENTS = (
    f"""CREATE TABLE IF NOT EXISTS {TOKENS_TABLE} (
        event_id INTEGER PRIMARY KEY, provenance VARCHAR NOT NULL, absent_reason TEXT,
        model VARCHAR, revision VARCHAR, prompt_shared INTEGER NOT NULL DEFAULT 0,
        prompt_rest BLOB, completion_ids BLOB, completion_logprobs BLOB,
        prompt_count INTEGER NOT NULL DEFAULT 0, completion_count INTEGER NOT NULL DEFAULT 0,
        diverged_at INTEGER, diverged_ids INTEGER)""",
)


# Version 12: rewards given again from the stored traces, keyed by session and version (a
# label, the scorer's code digest unless named), with the scorer that gave them; the
# session's own reward and outcome rows are never rewritten. The key serves a session's
# versions and a version's reward of one session (what a filter reads); the version index
# lists the versions (one seek each).
REWARD_VERSIONS_VERSION = 12
REWARD_VERSIONS_TABLE = "reward_versions"
_V12_STATEMENTS = (
    f"""CREATE TABLE IF NOT EXISTS {REWARD_VERSIONS_TABLE} (
        session_id VARCHAR NOT NULL, version VARCHAR NOT NULL, reward FLOAT NOT NULL,
        scorer TEXT NOT NULL, created_at DATETIME NOT NULL,
        PRIMARY KEY (session_id, version))""",
    f"CREATE INDEX IF NOT EXISTS idx_reward_versions_version ON {REWARD_VERSIONS_TABLE} "
    "(version)",
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


def _add_columns(wanted: tuple[tuple[str, str, str], ...], current: int,
                 columns: Callable[[str], set[str]]) -> list[Statement]:
    have: dict[str, set[str]] = {}
    stmts: list[Statement] = []
    for table, column, kind in wanted:
        existing = have.setdefault(table, columns(table) if current >= 1 else set())
        if column not in existing:
            stmts.append((f"ALTER TABLE {table} ADD COLUMN {column} {kind}", ()))
    return stmts


def _v7_statements() -> list[str]:
    columns = ", ".join(name for _, name, _ in V7_COLUMNS)
    derived = ", ".join(_derived(_T)[name] for _, name, _ in V7_COLUMNS)
    return [
        # Only the new columns change: no totals trigger watches them yet.
        f"UPDATE {_T} SET ({columns}) = ({derived})",
        *(f"DROP TRIGGER IF EXISTS {name}" for name in _FILL_TRIGGERS),
        *_fill_triggers(SESSION_FIELDS),
        # (The totals were rebuilt here, summing wall time from the duration column; the
        # step to version 8 rebuilds them.)
    ]


def _v11_statements() -> list[str]:
    return [
        f"""CREATE TABLE IF NOT EXISTS {JOURNAL_TABLE} (
            seq INTEGER PRIMARY KEY, session_id VARCHAR NOT NULL, body BLOB NOT NULL,
            rollout BLOB)""",
        # What a lost answer says of a session not stored yet (its write timed out and
        # lands later): applied when its row comes.
        f"""CREATE TABLE IF NOT EXISTS {AMENDMENTS_TABLE} (
            session_id VARCHAR PRIMARY KEY, error TEXT NOT NULL)""",
        f"""CREATE TRIGGER IF NOT EXISTS synth_deploy_amendment_applied AFTER INSERT ON {_T}
        WHEN EXISTS (SELECT 1 FROM {AMENDMENTS_TABLE} WHERE session_id = NEW.session_id)
        BEGIN
        UPDATE {_T} SET metadata = json_set(metadata, '$.status', 'error', '$.error', json(
            (SELECT error FROM {AMENDMENTS_TABLE} WHERE session_id = NEW.session_id)))
         WHERE session_id = NEW.session_id AND json_valid(metadata)
           AND json_extract(metadata, '$.status') = 'ok';
        DELETE FROM {AMENDMENTS_TABLE} WHERE session_id = NEW.session_id;
        END""",
    ]


SHARED_RECORDS_VERSION = 13
_RECORD_COLUMNS = ("app_id TEXT NOT NULL, rollout_id TEXT NOT NULL, digest TEXT NOT NULL, "
                   "status TEXT NOT NULL, owner TEXT NOT NULL, created_at TEXT NOT NULL, "
                   "updated_at TEXT NOT NULL, result TEXT, claim TEXT, touched_at REAL, "
                   "ttl_s REAL, stop TEXT, PRIMARY KEY (app_id, rollout_id)")


def _v13_statements(columns: Callable[[str], set[str]], current: int) -> list[str]:
    old = columns("async_rollouts") if current >= 1 else set()
    made = [f"CREATE TABLE IF NOT EXISTS async_rollouts ({_RECORD_COLUMNS})",
            # The runners' tick reads its own running rollouts.
            "CREATE INDEX IF NOT EXISTS async_rollouts_running ON async_rollouts (owner) "
            "WHERE status = 'running'",
            "CREATE TABLE IF NOT EXISTS rollout_runners (owner TEXT PRIMARY KEY, "
            "seen_at REAL NOT NULL)"]
    if not old or "app_id" in old:
        return made
    # Records a server made when first used, keyed by rollout id alone: the app that wrote
    # each is not known (""), so they are kept (running ones read as interrupted) and read
    # by no app; new ones are the apps' own.
    return ["ALTER TABLE async_rollouts RENAME TO async_rollouts_v11", *made,
            "INSERT INTO async_rollouts (app_id, rollout_id, digest, status, owner, created_at, "
            "updated_at, result) SELECT '', rollout_id, digest, status, owner, created_at, "
            "updated_at, result FROM async_rollouts_v11",
            "DROP TABLE async_rollouts_v11"]


def migration_plan(current: int, columns: Callable[[str], set[str]],
                   now: str) -> list[tuple[int, str, list[Statement]]]:
    """The steps from ``current`` to `SCHEMA_VERSION`: (version, description, statements).

    ``columns(table)`` reports a table's existing columns, so ADD COLUMN is never repeated
    on databases that already have some of them. What a later step rebuilds (the totals,
    the mode and split indexes) an earlier one no longer builds: every plan ends at
    `SCHEMA_VERSION`, in one transaction.
    """
    steps: list[tuple[int, str, list[Statement]]] = []
    if current < 1:
        steps.append((1, "synth-ai tracing v3 tables", [(sql, ()) for sql in _V1_TABLES]))
    if current < 2:
        stmts = _add_columns(V2_COLUMNS, current, columns)
        stmts += [(sql, ()) for sql in _V2_AFTER_COLUMNS]
        steps.append((2, "version table, session columns, stable event/message ids, indexes",
                      stmts))
    if current < 3:
        steps.append((3, "triggers keep the session columns filled for rows other writers add",
                      [(sql, ()) for sql in _V3_STATEMENTS]))
    if current < 4:  # its indexes are version 8's one now
        steps.append((4, "indexes for the viewer: status, mode, split, app/model glance", []))
    if current < 5:
        steps.append((5, "running totals for traces stats, kept by triggers", []))
    if current < 6:
        steps.append((6, "running totals count events", []))
    if current < 7:
        steps.append((7, "mode, split and duration as columns; totals read the duration",
                      _add_columns(V7_COLUMNS, current, columns)
                      + [(sql, ()) for sql in _v7_statements()]))
    if current < 8:
        steps.append((8, "one index for every filter the viewer offers; the run on its own",
                      [(sql, ()) for sql in _v8_statements()]))
    if current < 9:
        steps.append((9, "token ids and log-probabilities of LM calls, packed",
                      [(sql, ()) for sql in _V9_STATEMENTS]))
    if current < REWARD_OWNER_VERSION:
        steps.append((REWARD_OWNER_VERSION, "the session's reward is written by the store "
                      "alone: the outcome trigger goes",
                      [(f"DROP TRIGGER IF EXISTS {_OUTCOME_TRIGGER}", ())]))
    if current < JOURNAL_VERSION:
        steps.append((JOURNAL_VERSION, "a journal of whole sessions, their rows built later; "
                      "lost answers kept for sessions stored later",
                      [(sql, ()) for sql in _v11_statements()]))
    if current < REWARD_VERSIONS_VERSION:
        steps.append((REWARD_VERSIONS_VERSION, "rewards given again from stored traces, "
                      "by version, beside the originals",
                      [(sql, ()) for sql in _V12_STATEMENTS]))
    if current < SHARED_RECORDS_VERSION:
        steps.append((SHARED_RECORDS_VERSION, "async rollouts' records keyed by app and id, "
                      "shared by the servers on a store; runners' heartbeats",
                      [(sql, ()) for sql in _v13_statements(columns, current)]))
    for version, description, stmts in steps:
        if version >= 2:
            stmts.append((f"INSERT OR IGNORE INTO {VERSION_TABLE} (version, applied_at, "
                          "description) VALUES (?, ?, ?)", (version, now, description)))
    return steps


__all__ = ["AMENDMENTS_TABLE", "FILTERED_METADATA", "GLANCE_INDEX", "GLANCE_INDEX_VERSION",
           "INDEXED_METADATA_VERSION", "JOURNAL_TABLE", "JOURNAL_VERSION",
           "REWARD_VERSIONS_TABLE", "REWARD_VERSIONS_VERSION", "SHARED_RECORDS_VERSION",
           "SCHEMA_VERSION",
           "SESSION_FIELDS", "TOKENS_COLUMNS",
           "TOKENS_TABLE", "TOKENS_VERSION",
           "V2_COLUMNS", "V7_COLUMNS", "VERSION_TABLE", "detect_version", "metadata_field",
           "migration_plan", "session_fields"]
