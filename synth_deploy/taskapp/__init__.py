"""The task app SDK: declare a task app once, serve it anywhere.

    from synth_deploy.taskapp import TaskAppConfig, register_task_app, create_app
"""

from synth_deploy.taskapp.config import (
    ProxyConfig,
    RolloutContext,
    RubricBundle,
    TaskAppConfig,
    TaskDataset,
    TaskDatasetRegistry,
)
from synth_deploy.taskapp.contracts import (
    DatasetInfo,
    InferenceInfo,
    LimitsInfo,
    RolloutEnvSpec,
    RolloutMetrics,
    RolloutPolicySpec,
    RolloutRecordConfig,
    RolloutRequest,
    RolloutResponse,
    RolloutSafetyConfig,
    RolloutStep,
    RolloutTrajectory,
    RubricCriterion,
    RubricInfo,
    RubricSection,
    TaskDescriptor,
    TaskInfo,
)
from synth_deploy.taskapp.registry import (
    AppInfo,
    TaskAppEntry,
    discover_apps,
    load_app,
    register_task_app,
    registered_apps,
)

# The server half (fastapi, httpx) loads on first use, so importing the contracts or the
# registry (as `synth-deploy check` and `apps` do) stays light.
_LAZY = {
    "create_app": "synth_deploy.taskapp.server",
    "TraceSink": "synth_deploy.taskapp.server",
    "BackgroundServer": "synth_deploy.taskapp.serving",
    "serve": "synth_deploy.taskapp.serving",
    "call_policy": "synth_deploy.taskapp.policy",
    "chat_completions_url": "synth_deploy.taskapp.policy",
    "PolicyError": "synth_deploy.taskapp.policy",
    "PolicyReply": "synth_deploy.taskapp.policy",
    "ApiKeyAuth": "synth_deploy.taskapp.auth",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'synth_deploy.taskapp' has no attribute {name!r}")


__all__ = [
    "ApiKeyAuth",
    "AppInfo",
    "BackgroundServer",
    "DatasetInfo",
    "InferenceInfo",
    "LimitsInfo",
    "PolicyError",
    "PolicyReply",
    "ProxyConfig",
    "RolloutContext",
    "RolloutEnvSpec",
    "RolloutMetrics",
    "RolloutPolicySpec",
    "RolloutRecordConfig",
    "RolloutRequest",
    "RolloutResponse",
    "RolloutSafetyConfig",
    "RolloutStep",
    "RolloutTrajectory",
    "RubricBundle",
    "RubricCriterion",
    "RubricInfo",
    "RubricSection",
    "TaskAppConfig",
    "TaskAppEntry",
    "TaskDataset",
    "TaskDatasetRegistry",
    "TaskDescriptor",
    "TaskInfo",
    "TraceSink",
    "call_policy",
    "chat_completions_url",
    "create_app",
    "discover_apps",
    "load_app",
    "register_task_app",
    "registered_apps",
    "serve",
]
