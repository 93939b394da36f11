"""The task app SDK: declare a task app once, serve it anywhere.

    from synth_deploy.taskapp import TaskAppConfig, register_task_app, create_app
"""

from synth_deploy.taskapp.auth import ApiKeyAuth
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
from synth_deploy.taskapp.policy import PolicyError, PolicyReply, call_policy, chat_completions_url
from synth_deploy.taskapp.registry import (
    AppInfo,
    TaskAppEntry,
    discover_apps,
    load_app,
    register_task_app,
    registered_apps,
)
from synth_deploy.taskapp.server import TraceSink, create_app
from synth_deploy.taskapp.serving import BackgroundServer, serve

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
