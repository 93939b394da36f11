"""Modal deployment: declare settings next to a task app, build a ``modal.App``, deploy it.

    from synth_deploy.modal import DeployOptions, ModalSettings, deploy, modal_app

    task_app = TaskApp("math", ..., modal=ModalSettings(memory=512))   # in the app file
    app = modal_app(__file__)          # its last line: `modal deploy FILE` finds this App

    result = deploy("math", load_env(files), DeployOptions(env_files=files))  # from Python

Importing this package does not import modal; building and deploying import it when used.
The modules, one concept each:

    _settings      ModalSettings     how an app runs on Modal, declared next to it
    _image         ImageRecipe       what goes into the image (and what stays out)
    _secrets       SecretSource      which secrets reach the container, from where
    _plan          DeployPlan        everything a deployment will do, resolved offline
    _modal_app     build_modal_app   the plan as a modal.App; modal_app(__file__)
    _container     container_app     what Modal runs in the container
    _modal_cli     ModalCLI          Modal's command line as a bounded child process
    _credentials   has_modal_token   is there a Modal token, answered locally
    _reachability  require_modal_reachable   does Modal's API answer, within a deadline
    _deployment    deploy            plan ▸ validate ▸ modal deploy ▸ URL ▸ healthy ▸ .env
    _deployed      stop_app          the kit's deployed apps, listed and stopped
    _trace_volume  VolumeSnapshots   a container's new traces, copied to the Volume each interval
    _trace_pull    pull_traces       the Volume's traces, merged into a local store
    _shared_records DictRolloutRecords async rollouts' records every container shares
"""

from synth_deploy.modal._container import container_memory
from synth_deploy.modal._container import web as container_app
from synth_deploy.modal._credentials import has_modal_token, require_modal_token
from synth_deploy.modal._deployed import DeployedApp, StopResult, deployed_apps, stop_app
from synth_deploy.modal._deployment import (
    DeployOptions,
    DeployResult,
    LocalValidationError,
    app_logs,
    deploy,
    serve_dev,
    validate_locally,
)
from synth_deploy.modal._image import (
    SERVING_PACKAGES,
    SOURCE_EXCLUDED_PACKAGES,
    ImageRecipe,
    LocalDir,
    dependency_closure,
)
from synth_deploy.modal._modal_app import build_modal_app, modal_app, modal_app_for, web_function
from synth_deploy.modal._modal_cli import (
    MODAL_REQUIREMENT,
    CLIResult,
    ModalCLI,
    ModalCLIError,
    find_web_url,
)
from synth_deploy.modal._plan import DeployPlan, build_plan
from synth_deploy.modal._reachability import modal_api_endpoints, require_modal_reachable
from synth_deploy.modal._secrets import SecretSource
from synth_deploy.modal._settings import ModalSettings
from synth_deploy.modal._shared_records import (
    ROLLOUT_DICT_VAR,
    DictRolloutRecords,
    rollout_dict_name,
)
from synth_deploy.modal._trace_pull import (
    ContainerPull,
    FilePull,
    PullResult,
    TraceVolume,
    UnreadFile,
    pull_traces,
)
from synth_deploy.modal._trace_volume import (
    CONTAINER_MEMORY_VAR,
    DEFAULT_TRACE_COMMIT_S,
    TRACE_VOLUME_MOUNT,
    VolumeSnapshots,
    default_trace_volume,
)

__all__ = [
    "CONTAINER_MEMORY_VAR",
    "DEFAULT_TRACE_COMMIT_S",
    "ROLLOUT_DICT_VAR",
    "DictRolloutRecords",
    "rollout_dict_name",
    "MODAL_REQUIREMENT",
    "SERVING_PACKAGES",
    "SOURCE_EXCLUDED_PACKAGES",
    "CLIResult",
    "ContainerPull",
    "DeployOptions",
    "DeployPlan",
    "DeployResult",
    "DeployedApp",
    "FilePull",
    "ImageRecipe",
    "LocalDir",
    "LocalValidationError",
    "ModalCLI",
    "ModalCLIError",
    "ModalSettings",
    "PullResult",
    "SecretSource",
    "StopResult",
    "TRACE_VOLUME_MOUNT",
    "TraceVolume",
    "UnreadFile",
    "VolumeSnapshots",
    "build_modal_app",
    "app_logs",
    "build_plan",
    "container_app",
    "container_memory",
    "default_trace_volume",
    "dependency_closure",
    "deploy",
    "deployed_apps",
    "find_web_url",
    "has_modal_token",
    "modal_api_endpoints",
    "modal_app",
    "modal_app_for",
    "pull_traces",
    "require_modal_reachable",
    "require_modal_token",
    "serve_dev",
    "stop_app",
    "validate_locally",
    "web_function",
]
