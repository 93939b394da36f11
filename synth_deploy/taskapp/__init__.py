"""The task app SDK: what an app author writes against to declare a task app once.

    from synth_deploy.taskapp import TaskApp, RolloutRequest, RolloutContext, call_policy

This package's names are the ones an app file uses (the bundled apps use these and no
others). The rest of the SDK is in public modules named for what they hold, as Starlette's
are: `contracts` (every wire model of synth-ai's protocol), `config` (`TaskAppConfig`, what a
`TaskApp` builds), `registry` (finding and loading app files), `policy` (the policy call's
errors and URL rules), `tools` (chat and tool-call messages), `workers` (`worker_object`'s
pool), `scaffold` (`synth-deploy init`), `scoring` (`@task_app.scorer`: an episode scored
again from its trace, `traces rescore`). The engine that serves what is declared here is
`synth_deploy.serving`.

Declaring is light; `call_policy` and `worker_object` load their clients on first use.
"""

from synth_deploy._lazy import lazy_attributes
from synth_deploy.errors import BadRequest, InvalidAction
from synth_deploy.taskapp._environment import Outcome, Reward, Step
from synth_deploy.taskapp._task_app import TaskApp
from synth_deploy.taskapp.config import RolloutContext, RubricBundle, TaskDataset
from synth_deploy.taskapp.contracts import (
    LimitsInfo,
    RolloutRequest,
    RolloutStep,
    RolloutTrajectory,
    RubricCriterion,
    RubricSection,
    TaskDescriptor,
    TaskInfo,
)
from synth_deploy.taskapp.tools import (
    ToolCall,
    function_tool,
    image_part,
    png_data_url,
    text_part,
    tool_message,
)

__getattr__ = lazy_attributes(__name__, {"call_policy": "policy", "worker_object": "workers"})

__all__ = [
    "BadRequest",
    "InvalidAction",
    "LimitsInfo",
    "Outcome",
    "Reward",
    "RolloutContext",
    "RolloutRequest",
    "RolloutStep",
    "RolloutTrajectory",
    "RubricBundle",
    "RubricCriterion",
    "RubricSection",
    "Step",
    "TaskApp",
    "TaskDataset",
    "TaskDescriptor",
    "TaskInfo",
    "ToolCall",
    "call_policy",
    "function_tool",
    "image_part",
    "png_data_url",
    "text_part",
    "tool_message",
    "worker_object",
]
