"""The task app SDK: what an app author writes against to declare a task app once.

    from synth_deploy.taskapp import TaskApp, RolloutRequest, call_policy

Declaring (contracts, config, registry) is light; `call_policy` and `worker_object` load on
first use. The engine that serves what is declared here is `synth_deploy.serving`.
"""

from synth_deploy._lazy import lazy_attributes
from synth_deploy.errors import BadRequest, InvalidAction
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
from synth_deploy.taskapp._environment import Outcome, Reward, Step
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
from synth_deploy.taskapp._scaffold import scaffold_app
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
    "call_policy": "_policy",
    "is_link_local": "_outbound",
    "refused_address": "_outbound",
    "chat_completions_url": "_policy",
    "PolicyError": "_policy",
    "PolicyReply": "_policy",
    "RemoteObject": "_workers",
    "WorkerError": "_workers",
    "WorkerPool": "_workers",
    "worker_object": "_workers",
}

__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = [
    "AppFileProblem",
    "AppInfo",
    "BUNDLED_APPS_DIR",
    "BadRequest",
    "DatasetInfo",
    "Discovery",
    "InferenceInfo",
    "InvalidAction",
    "LimitsInfo",
    "Outcome",
    "PolicyError",
    "PolicyReply",
    "ProxyConfig",
    "RemoteObject",
    "Reward",
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
    "Step",
    "TaskApp",
    "TaskAppConfig",
    "TaskAppEntry",
    "TaskDataset",
    "TaskDatasetRegistry",
    "TaskDescriptor",
    "TaskInfo",
    "ToolCall",
    "WorkerError",
    "WorkerPool",
    "assistant_message",
    "call_policy",
    "chat_completions_url",
    "discover_apps",
    "is_link_local",
    "function_tool",
    "image_part",
    "load_app",
    "parse_tool_calls",
    "refused_address",
    "png_data_url",
    "register_task_app",
    "registered_apps",
    "scaffold_app",
    "scan_apps",
    "text_part",
    "tool_message",
    "worker_object",
]
