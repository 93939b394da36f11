"""The serving engine: what runs a task app declared with `synth_deploy.taskapp`.

    from synth_deploy.serving import LocalRunner, ServeSettings

By role, as uvicorn's protocols/ and loops/ are: the app's assembly (`_server`) and route
table (`_routes`), the key gate (`_key_gate`), the core routes (`_core_routes`), the rollout
run (`_rollout_run`: a typed outcome each protocol renders) and `/rollout`'s endpoint
(`_rollout_endpoint`), admission (`_admission`), connections, auth, the vendor proxy, the one
local runner every command uses (`_runner`), and one folder per protocol beyond synth-ai's
`/rollout` (`openenv/`, `containers/`).

Limits and keys (`_admission`, `_auth`) are light; the app, the runner and the server (fastapi,
uvicorn) load on first use, so `synth-deploy --help` and `deploy --dry-run` pay for no server.
"""

from synth_deploy._lazy import lazy_attributes
from synth_deploy.serving._admission import (
    DEFAULT_MAX_ROLLOUTS,
    DRAIN_VAR,
    HEAD_AFTER_VAR,
    HEARTBEAT_VAR,
    MAX_ROLLOUTS_VAR,
    ConnectionLimits,
    RolloutLimits,
    answered_status,
    failure_kind,
    rollout_limits,
)
from synth_deploy.serving._auth import ApiKeyAuth, KeyRule, ServerKeys, server_keys

_LAZY = {
    "create_app": "_server",
    "KeyGate": "_key_gate",
    "stats_of": "_server",
    "TraceSink": "_server",
    "error_response": "_responses",
    "BackgroundServer": "_runner",
    "DEFAULT_SUMMARY_EVERY_S": "_runner",
    "prepare_serving_process": "_runner",
    "LocalRunner": "_runner",
    "ServeSettings": "_runner",
}

__getattr__ = lazy_attributes(__name__, _LAZY)

__all__ = [
    "ApiKeyAuth",
    "BackgroundServer",
    "ConnectionLimits",
    "DEFAULT_MAX_ROLLOUTS",
    "DEFAULT_SUMMARY_EVERY_S",
    "DRAIN_VAR",
    "KeyGate",
    "KeyRule",
    "LocalRunner",
    "HEAD_AFTER_VAR",
    "HEARTBEAT_VAR",
    "MAX_ROLLOUTS_VAR",
    "RolloutLimits",
    "ServeSettings",
    "ServerKeys",
    "TraceSink",
    "answered_status",
    "create_app",
    "error_response",
    "failure_kind",
    "prepare_serving_process",
    "rollout_limits",
    "server_keys",
    "stats_of",
]
