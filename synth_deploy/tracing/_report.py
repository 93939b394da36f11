"""`TraceDbReport`: which trace database is in force, why, and what state it is in.

What `synth-deploy traces where` and `traces init` show (as text, or `to_dict` for
``--json``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from synth_deploy.env import Env
from synth_deploy.errors import SynthDeployError
from synth_deploy.tracing._config import TraceDbSetting, resolve_trace_db
from synth_deploy.tracing._db._schema import SCHEMA_VERSION
from synth_deploy.tracing._errors import (
    NotATraceDbError,
    SchemaTooNewError,
    TraceDbAuthError,
    TraceDbMissingError,
    TraceDbUnreachableError,
)

# Errors that carry the remote server's answer, so it was reached.
_ANSWERED = (TraceDbAuthError, SchemaTooNewError, NotATraceDbError)


@dataclass(frozen=True)
class TraceDbReport:
    """The trace database in force and its state; never holds a secret."""

    url: str
    source: str
    kind: str
    token: str | None
    exists: bool
    reachable: bool | None
    schema_version: int | None
    counts: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    hint: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "ok": self.ok}


def describe_trace_db(flag: str | None, env: Env) -> TraceDbReport:
    """Resolve the setting and look at the database (read-only: nothing is created or
    migrated); errors become part of the report."""
    from synth_deploy.tracing._store import TraceStore

    setting = resolve_trace_db(flag, env)
    base = _base(setting)
    try:
        with TraceStore(setting, read_only=True) as store:
            older = store.schema_version < SCHEMA_VERSION
            return TraceDbReport(**base, exists=True, reachable=True,
                                 schema_version=store.schema_version,
                                 counts=store.table_counts(),
                                 hint=f"read as it is; `synth-deploy traces init` (or the first "
                                      f"traced run) migrates it to v{SCHEMA_VERSION}"
                                 if older else None)
    except TraceDbMissingError as exc:  # a remote server without trace tables answered
        return TraceDbReport(**base, exists=False, reachable=True if setting.is_remote else None,
                             schema_version=None, error=None, hint=exc.hint)
    except SynthDeployError as exc:
        reachable = _reachable(exc) if setting.is_remote else None
        return TraceDbReport(**base, exists=not setting.is_remote and bool(
            setting.path and setting.path.exists()), reachable=reachable, schema_version=None,
            error=exc.message, hint=exc.hint)


def init_trace_db(flag: str | None, env: Env) -> TraceDbReport:
    """Create (or migrate) the trace database in force; raises on failure."""
    from synth_deploy.tracing._store import TraceStore

    setting = resolve_trace_db(flag, env)
    with TraceStore(setting, create=True) as store:
        return TraceDbReport(**_base(setting), exists=True, reachable=True,
                             schema_version=store.schema_version, counts=store.table_counts())


def _reachable(exc: SynthDeployError) -> bool | None:
    """False only when the server did not answer; None when the error says nothing either way
    (the client could not start, for instance)."""
    if isinstance(exc, TraceDbUnreachableError):
        return False
    return True if isinstance(exc, _ANSWERED) else None


def _base(setting: TraceDbSetting) -> dict[str, Any]:
    kind = "libsql (remote)" if setting.is_remote else "sqlite (embedded file)"
    token = setting.token_source if setting.is_remote else None
    return {"url": setting.display, "source": setting.source, "kind": kind,
            "token": token or ("none" if setting.is_remote else None)}


__all__ = ["TraceDbReport", "describe_trace_db", "init_trace_db"]
