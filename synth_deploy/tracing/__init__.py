"""Traces of rollouts: what a rollout records (`SessionTracer`) and where it is stored.

    setting = resolve_trace_db(flag, env)          # --trace-db > SYNTH_TRACES_DB > default
    with open_trace_store(setting) as store:
        await store.write_session(session)         # durable on return

Heavy or optional parts load on use: ``libsql`` only for a remote URL (in a child process).
"""

from synth_deploy.tracing._config import (
    DEFAULT_TRACE_DB,
    TOKEN_VAR,
    TRACES_DB_VAR,
    TraceDbSetting,
    deploy_notice,
    parse_trace_db,
    resolve_trace_db,
)
from synth_deploy.tracing._errors import (
    NotATraceDbError,
    SchemaTooNewError,
    SessionNotFoundError,
    TraceDbAuthError,
    TraceDbMissingError,
    TraceDbUnreachableError,
    TraceDbUrlError,
)
from synth_deploy.tracing._export import ExportResult, export_sft, sft_examples
from synth_deploy.tracing._report import TraceDbReport, describe_trace_db, init_trace_db
from synth_deploy.tracing._schema import SCHEMA_VERSION
from synth_deploy.tracing._session import (
    Event,
    EventReward,
    Message,
    OutcomeReward,
    SessionTrace,
    SessionTracer,
    Timestep,
)
from synth_deploy.tracing._store import (
    SessionSummary,
    TraceStats,
    TraceStore,
    open_trace_store,
    since_timestamp,
)

__all__ = [
    "DEFAULT_TRACE_DB",
    "SCHEMA_VERSION",
    "TOKEN_VAR",
    "TRACES_DB_VAR",
    "Event",
    "EventReward",
    "ExportResult",
    "Message",
    "NotATraceDbError",
    "OutcomeReward",
    "SchemaTooNewError",
    "SessionNotFoundError",
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
    "TraceStats",
    "TraceStore",
    "deploy_notice",
    "describe_trace_db",
    "export_sft",
    "init_trace_db",
    "open_trace_store",
    "parse_trace_db",
    "resolve_trace_db",
    "sft_examples",
    "since_timestamp",
]
