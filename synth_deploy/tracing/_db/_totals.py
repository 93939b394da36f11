"""Running totals for `traces stats`: as cheap to read at a million sessions as at ten.

Two small tables, one row per group of sessions (app, status, model, mode and split) and
one per LM model, kept in step by SQLite triggers with every insert, update and delete of a
session row or an LM-call event, by whoever writes them (our writer, or synth-ai's tracer
writing into a file we migrated). Schema version 5 created them; version 6 counts events
too (so `stats` never counts the events table); version 7 sums wall time from the session's
duration column, where it was parsed from the metadata JSON; version 8 groups by model,
mode and split too, so the values the viewer's filters offer are read here (`choices`)
rather than from an index per filter. The step to version 8 drops what an earlier step
made, creates the tables, fills them from the rows already stored and adds the triggers, in
one transaction. Files opened read-only below version 6 are summed from their rows instead:
the same answers, slower.
"""

from __future__ import annotations

from synth_deploy.tracing._db._columns import cost_usd_sql

TOTALS_VERSION = 6
CHOICES_VERSION = 8  # the session totals name every filter value from here
SESSION_KEYS = ("app_id", "status", "model_name", "mode", "split")
SESSIONS = "synth_deploy_session_totals"
MODELS = "synth_deploy_model_totals"


_SESSION_SUMS = {  # column: what one session row adds
    "sessions": "1", "timesteps": "COALESCE({r}.num_timesteps, 0)",
    "events": "COALESCE({r}.num_events, 0)", "messages": "COALESCE({r}.num_messages, 0)",
    "reward_sum": "COALESCE({r}.total_reward, 0)",
    "rewards": "({r}.total_reward IS NOT NULL)",
    # the rollout's wall time, as our server records it (the cost ledger's wall_s)
    "wall_s": "COALESCE(CAST({r}.duration_s AS REAL), 0)"}
_MODEL_SUMS = {  # column: what one LM call adds
    "lm_calls": "1", "input_tokens": "COALESCE({r}.input_tokens, 0)",
    "output_tokens": "COALESCE({r}.output_tokens, 0)",
    "latency_sum": "COALESCE({r}.latency_ms, 0)", "latencies": "({r}.latency_ms IS NOT NULL)",
    "cost_usd": f"COALESCE({cost_usd_sql('{r}')}, 0)"}


def _apply(table: str, keys: tuple[str, ...], sums: dict[str, str], r: str, sign: str,
           when: str = "1") -> list[str]:
    """Statements adding (``sign`` +) or removing (-) row ``r`` (NEW or OLD) to its group;
    keys compare with IS, so a NULL app or status is a group like any other."""
    match = " AND ".join(f"{k} IS {r}.{k_src}" for k, k_src in keys_of(keys))
    seed = ", ".join(f"{r}.{k_src}" for _, k_src in keys_of(keys))
    zeros = ", ".join("0" for _ in sums)
    return [
        f"INSERT INTO {table} ({', '.join(k for k, _ in keys_of(keys))}, {', '.join(sums)}) "
        f"SELECT {seed}, {zeros} WHERE ({when}) AND NOT EXISTS "
        f"(SELECT 1 FROM {table} WHERE {match});",
        f"UPDATE {table} SET " + ", ".join(
            f"{col} = {col} {sign} {expr.format(r=r)}" for col, expr in sums.items())
        + f" WHERE ({when}) AND {match};",
    ]


def keys_of(keys: tuple[str, ...]) -> list[tuple[str, str]]:
    # (totals column, source column): the model table's key is the event's model_name.
    return [(k, "model_name" if k == "model" else k) for k in keys]


def _triggers() -> list[str]:
    s_keys, m_keys = SESSION_KEYS, ("model",)
    session_cols = ", ".join((*SESSION_KEYS, "total_reward", "num_timesteps", "num_events",
                              "num_messages", "duration_s"))
    event_cols = "event_type, model_name, input_tokens, output_tokens, cost_usd, latency_ms, " \
                 "event_uid"
    lm_new, lm_old = "NEW.event_type = 'cais'", "OLD.event_type = 'cais'"

    def trigger(name: str, event: str, table: str, body: list[str]) -> str:
        return (f"CREATE TRIGGER IF NOT EXISTS synth_deploy_totals_{name} AFTER {event} ON "
                f"{table} BEGIN " + " ".join(body) + " END")

    return [
        trigger("session_added", "INSERT", "session_traces",
                _apply(SESSIONS, s_keys, _SESSION_SUMS, "NEW", "+")),
        trigger("session_removed", "DELETE", "session_traces",
                _apply(SESSIONS, s_keys, _SESSION_SUMS, "OLD", "-")),
        trigger("session_changed", f"UPDATE OF {session_cols}", "session_traces",
                _apply(SESSIONS, s_keys, _SESSION_SUMS, "OLD", "-")
                + _apply(SESSIONS, s_keys, _SESSION_SUMS, "NEW", "+")),
        trigger("lm_added", "INSERT", "events",
                _apply(MODELS, m_keys, _MODEL_SUMS, "NEW", "+", lm_new)),
        trigger("lm_removed", "DELETE", "events",
                _apply(MODELS, m_keys, _MODEL_SUMS, "OLD", "-", lm_old)),
        trigger("lm_changed", f"UPDATE OF {event_cols}", "events",
                _apply(MODELS, m_keys, _MODEL_SUMS, "OLD", "-", lm_old)
                + _apply(MODELS, m_keys, _MODEL_SUMS, "NEW", "+", lm_new)),
    ]


def _groups(keys: str, sums: dict[str, str], source: str) -> str:
    return (f"SELECT {keys}, " + ", ".join(
        f"SUM({expr.format(r='x')}) AS {col}" for col, expr in sums.items())
        + f" FROM {source} GROUP BY {keys}")


_TRIGGER_NAMES = ("session_added", "session_removed", "session_changed", "lm_added",
                  "lm_removed", "lm_changed")


def migration() -> list[str]:
    """The tables, filled from the rows stored so far, then the triggers (schema version 7:
    the duration column must exist)."""
    return [
        *(f"DROP TRIGGER IF EXISTS synth_deploy_totals_{name}" for name in _TRIGGER_NAMES),
        f"DROP TABLE IF EXISTS {SESSIONS}",
        f"DROP TABLE IF EXISTS {MODELS}",
        f"CREATE TABLE IF NOT EXISTS {SESSIONS} (app_id TEXT, status TEXT, model_name TEXT, "
        "mode TEXT, split TEXT, sessions INTEGER NOT NULL, timesteps INTEGER NOT NULL, events "
        "INTEGER NOT NULL, messages INTEGER NOT NULL, reward_sum REAL NOT NULL, rewards "
        "INTEGER NOT NULL, wall_s REAL NOT NULL)",
        # The triggers find a session's group by its keys: a seek, however many groups.
        f"CREATE INDEX IF NOT EXISTS {SESSIONS}_keys ON {SESSIONS} ({', '.join(SESSION_KEYS)})",
        f"CREATE TABLE IF NOT EXISTS {MODELS} (model TEXT, lm_calls INTEGER NOT NULL, "
        "input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, latency_sum REAL NOT "
        "NULL, latencies INTEGER NOT NULL, cost_usd REAL NOT NULL)",
        f"INSERT INTO {SESSIONS} " + _groups(", ".join(SESSION_KEYS), _SESSION_SUMS,
                                             "session_traces x"),
        f"INSERT INTO {MODELS} " + _groups("model_name", _MODEL_SUMS,
                                           "events x WHERE x.event_type = 'cais'"),
        *_triggers(),
    ]


def choices(field: str) -> str:
    """The values of ``field`` (one of `SESSION_KEYS`) some stored session has, in order
    (schema version `CHOICES_VERSION` on)."""
    return (f"SELECT DISTINCT {field} AS v FROM {SESSIONS} WHERE sessions != 0 AND {field} "
            f"IS NOT NULL ORDER BY v")


def session_groups(fields: dict[str, str], version: int) -> str:
    """Per group (at least app_id and status): sessions, timesteps, events, messages,
    reward_sum, rewards, wall_s (events: as the session rows count them)."""
    if version >= TOTALS_VERSION:
        return f"SELECT * FROM {SESSIONS} WHERE sessions != 0"
    # Older files: summed from the rows (their columns, or the metadata, as `fields` says).
    sums = {col: expr.replace("{r}.total_reward", fields["total_reward"]).replace("{r}", "s")
            for col, expr in _SESSION_SUMS.items()}
    sums["wall_s"] = f"COALESCE(CAST({fields['duration_s']} AS REAL), 0)"
    return (f"SELECT {fields['app_id']} AS app_id, {fields['status']} AS status, "
            + ", ".join(f"SUM({expr}) AS {col}" for col, expr in sums.items())
            + " FROM session_traces s GROUP BY 1, 2")


def model_groups(version: int) -> str:
    """Per model: lm_calls, input_tokens, output_tokens, latency_sum, latencies, cost_usd."""
    if version >= TOTALS_VERSION:
        return f"SELECT * FROM {MODELS} WHERE lm_calls != 0"
    sums = dict(_MODEL_SUMS)
    sums["cost_usd"] = f"COALESCE({cost_usd_sql('{r}', version)}, 0)"
    return "SELECT x.model_name AS model, " + ", ".join(
        f"SUM({expr.format(r='x')}) AS {col}" for col, expr in sums.items()) \
        + " FROM events x WHERE x.event_type = 'cais' GROUP BY x.model_name"


__all__ = ["CHOICES_VERSION", "MODELS", "SESSIONS", "SESSION_KEYS", "TOTALS_VERSION", "choices",
           "migration", "model_groups", "session_groups"]
