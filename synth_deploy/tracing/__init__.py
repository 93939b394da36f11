"""Traces of rollouts: what a rollout records (`SessionTracer`) and where it is stored.

    setting = resolve_trace_db(flag, env)          # --trace-db > SYNTH_TRACES_DB > default
    with open_trace_store(setting) as store:
        await store.write_session(session)         # durable on return

Heavy or optional parts load on use: ``libsql`` only for a remote URL (in a child process),
and what reads a store (browsing, export, reports) on its first use.
"""

from synth_deploy._lazy import lazy_attributes
from synth_deploy.tracing._config import (
    DEFAULT_TRACE_DB,
    TOKEN_VAR,
    TRACES_DB_VAR,
    TraceDbSetting,
    parse_trace_db,
    resolve_trace_db,
)
from synth_deploy.tracing._db._columns import IDENTITY_PATHS
from synth_deploy.tracing._db._schema import SCHEMA_VERSION
from synth_deploy.tracing._db._select import SessionFilter, since_timestamp
from synth_deploy.tracing._errors import (
    NotATraceDbError,
    SchemaTooNewError,
    SessionConflictError,
    SessionNotFoundError,
    TraceDbAuthError,
    TraceDbMissingError,
    TraceDbUnreachableError,
    TraceDbUrlError,
    TraceFormatError,
)
from synth_deploy.tracing._ledger import CostLedger, ModelTokens, event_tokens, ledger_of
from synth_deploy.tracing._rollout_facts import RolloutFacts, describe_session
from synth_deploy.tracing._rollout_records import (
    RECORD_KEPT,
    RECORD_KEPT_S,
    RUNNER_LOST_S,
    TICK_S,
    RolloutClaim,
    RolloutFinish,
    RolloutRecord,
    RolloutRecords,
    RunnerNews,
)
from synth_deploy.tracing._session import (
    Event,
    EventReward,
    Message,
    OutcomeReward,
    SessionTrace,
    SessionTracer,
    Timestep,
    session_reward,
)
from synth_deploy.tracing._store import (
    SessionSummary,
    TraceStats,
    TraceStore,
    open_trace_store,
)
from synth_deploy.tracing._times import utc_text, zoned
from synth_deploy.tracing._tokens import (
    ContinuityBreak,
    TokenSummary,
    TurnTokens,
    continuity_breaks,
    shared_prefix,
    summarize,
    valid_ids,
    valid_logprobs,
)
from synth_deploy.tracing._trace_context import (
    TRACEPARENT,
    TraceParent,
    incoming_trace_context,
    incoming_trace_parent,
)
from synth_deploy.tracing._write._log import (
    SessionLog,
    pending_limit,
    read_session_log,
    session_log,
    write_session_log,
)

# What reads a store (browsing, export, reports, prices, replay) loads on first use: a
# served app and its writer process only record and store.
_ON_USE = {
    "_read._browse": ("SORT_KEYS", "IdentityGroup", "SessionPage", "SessionRow",
                      "browse_sessions", "filter_choices", "identity_groups",
                      "matching_session_ids"),
    "_read._export": ("ExportResult", "export_sft"),
    "_read._tokens": ("TokenExportResult", "export_tokens"),
    "_read._sft": ("flat_tools", "sft_examples"),
    "_prices": ("PRICES_VAR", "CostEstimate", "ModelPrice", "PriceTable", "load_price_table",
                "resolve_price_table"),
    "_read._replay": ("ReplayStep", "content_text", "message_text", "replay"),
    "_report": ("TraceDbReport", "describe_trace_db", "init_trace_db"),
    "_read._rewards": ("Comparison", "RewardSummary", "compare_by_seed", "reward_summary"),
    "_shapes": ("session_from_trace",),
    "_merge": ("MergeResult", "merge_trace_file"),
    "_rescore": ("ORIGINAL_REWARD", "RescoreResult", "Unscored", "rescore_sessions",
                 "reward_versions", "reward_versions_of"),
}
# The session metadata keys that say which code of its app made it (version, digest).
SESSION_IDENTITY_KEYS = tuple(IDENTITY_PATHS)
__getattr__ = lazy_attributes(__name__, {name: module for module, names in _ON_USE.items()
                                         for name in names})

__all__ = [
    "DEFAULT_TRACE_DB",
    "SCHEMA_VERSION",
    "SESSION_IDENTITY_KEYS",
    "SORT_KEYS",
    "TOKEN_VAR",
    "TRACEPARENT",
    "TRACES_DB_VAR",
    "Comparison",
    "ContinuityBreak",
    "CostEstimate",
    "CostLedger",
    "Event",
    "EventReward",
    "ExportResult",
    "IdentityGroup",
    "MergeResult",
    "Message",
    "NotATraceDbError",
    "ORIGINAL_REWARD",
    "OutcomeReward",
    "ReplayStep",
    "RescoreResult",
    "ModelPrice",
    "ModelTokens",
    "PRICES_VAR",
    "PriceTable",
    "RewardSummary",
    "RolloutFacts",
    "RolloutClaim",
    "RolloutFinish",
    "RolloutRecord",
    "RolloutRecords",
    "RunnerNews",
    "RECORD_KEPT",
    "RECORD_KEPT_S",
    "RUNNER_LOST_S",
    "TICK_S",
    "SchemaTooNewError",
    "SessionConflictError",
    "SessionFilter",
    "SessionLog",
    "SessionNotFoundError",
    "SessionPage",
    "SessionRow",
    "SessionSummary",
    "SessionTrace",
    "SessionTracer",
    "Timestep",
    "TraceDbAuthError",
    "TraceDbMissingError",
    "TraceDbReport",
    "TraceDbSetting",
    "TraceDbUnreachableError",
    "TraceDbUrlError",
    "TraceFormatError",
    "TraceParent",
    "TraceStats",
    "TokenExportResult",
    "TokenSummary",
    "TraceStore",
    "TurnTokens",
    "Unscored",
    "browse_sessions",
    "compare_by_seed",
    "continuity_breaks",
    "content_text",
    "event_tokens",
    "ledger_of",
    "load_price_table",
    "describe_session",
    "describe_trace_db",
    "export_sft",
    "export_tokens",
    "flat_tools",
    "filter_choices",
    "identity_groups",
    "incoming_trace_context",
    "incoming_trace_parent",
    "init_trace_db",
    "matching_session_ids",
    "merge_trace_file",
    "message_text",
    "open_trace_store",
    "parse_trace_db",
    "replay",
    "rescore_sessions",
    "reward_versions",
    "reward_versions_of",
    "read_session_log",
    "session_log",
    "pending_limit",
    "write_session_log",
    "resolve_trace_db",
    "resolve_price_table",
    "reward_summary",
    "session_reward",
    "session_from_trace",
    "sft_examples",
    "shared_prefix",
    "since_timestamp",
    "utc_text",
    "zoned",
    "summarize",
    "valid_ids",
    "valid_logprobs",
]
