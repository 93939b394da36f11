"""The task app SDK: declare a task app once, serve it anywhere.

    from synth_deploy.taskapp import TaskAppConfig, register_task_app, create_app

Declaring (contracts, config, registry) is light; serving (`create_app`, `LocalRunner`,
`call_policy`: fastapi, uvicorn, httpx) loads on first use, so `synth-deploy check` and
`apps` can import the contracts without paying for a server.
"""

from synth_deploy.errors import BadRequest
from synth_deploy.taskapp._auth import KeyRule, ServerKeys, server_keys
from synth_deploy.taskapp._config import (
    ProxyConfig,
    RolloutContext,
    RubricBundle,
    TaskAppConfig,
    TaskDataset,
    TaskDatasetRegistry,
)
from synth_deploy.taskapp._contracts import (
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
from synth_deploy.taskapp._registry import (
    BUNDLED_APPS_DIR,
    AppFileProblem,
    AppInfo,
    Discovery,
    TaskAppEntry,
    discover_apps,
    load_app,
    register_task_app,
    registered_apps,
    scan_apps,
)
from synth_deploy.taskapp._task_app import TaskApp
from synth_deploy.taskapp._tools import (
    ToolCall,
    assistant_message,
    function_tool,
    image_part,
    parse_tool_calls,
    png_data_url,
    text_part,
    tool_message,
)

_LAZY = {
    "create_app": "_server",
    "stats_of": "_server",
    "TraceSink": "_server",
    "error_response": "_responses",
    "BackgroundServer": "_runner",
    "ConnectionLimits": "_runner",
    "LocalRunner": "_runner",
    "ServeSettings": "_runner",
    "call_policy": "_policy",
    "is_link_local": "_outbound",
    "chat_completions_url": "_policy",
    "PolicyError": "_policy",
    "PolicyReply": "_policy",
    "ApiKeyAuth": "_auth",
    "RemoteObject": "_workers",
    "WorkerError": "_workers",
    "WorkerPool": "_workers",
    "worker_object": "_workers",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'synth_deploy.taskapp' has no attribute {name!r}")


__all__ = [
    "ApiKeyAuth",
    "AppFileProblem",
    "AppInfo",
    "BUNDLED_APPS_DIR",
    "BackgroundServer",
    "BadRequest",
    "ConnectionLimits",
    "DatasetInfo",
    "Discovery",
    "InferenceInfo",
    "KeyRule",
    "LimitsInfo",
    "LocalRunner",
    "PolicyError",
    "PolicyReply",
    "ProxyConfig",
    "RemoteObject",
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
    "ServeSettings",
    "ServerKeys",
    "TaskApp",
    "TaskAppConfig",
    "TaskAppEntry",
    "TaskDataset",
    "TaskDatasetRegistry",
    "TaskDescriptor",
    "TaskInfo",
    "ToolCall",
    "TraceSink",
    "WorkerError",
    "WorkerPool",
    "assistant_message",
    "call_policy",
    "chat_completions_url",
    "create_app",
    "discover_apps",
    "is_link_local",
    "error_response",
    "function_tool",
    "image_part",
    "load_app",
    "parse_tool_calls",
    "png_data_url",
    "register_task_app",
    "registered_apps",
    "scan_apps",
    "server_keys",
    "stats_of",
    "text_part",
    "tool_message",
    "worker_object",
]
