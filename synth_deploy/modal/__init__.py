"""Modal deployment: declare settings next to a task app, build a ``modal.App``, deploy it.

    from synth_deploy.modal import ModalSettings, build_plan, build_modal_app, deploy

Importing this package does not import modal; the builder and deployer import it when used.
"""

from synth_deploy.modal.builder import build_modal_app, modal_app, modal_app_for, web_function
from synth_deploy.modal.credentials import has_modal_token, require_modal_token
from synth_deploy.modal.deploy import (
    DeployResult,
    LocalValidationError,
    deploy,
    serve_dev,
    validate_locally,
)
from synth_deploy.modal.image import ImageRecipe, LocalDir
from synth_deploy.modal.plan import DeployPlan, build_plan
from synth_deploy.modal.runner import ModalCLI, ModalCLIError, find_web_url
from synth_deploy.modal.secrets import SecretSource
from synth_deploy.modal.settings import ModalSettings

__all__ = [
    "DeployPlan",
    "DeployResult",
    "ImageRecipe",
    "LocalDir",
    "LocalValidationError",
    "ModalCLI",
    "ModalCLIError",
    "ModalSettings",
    "SecretSource",
    "build_modal_app",
    "build_plan",
    "deploy",
    "find_web_url",
    "has_modal_token",
    "modal_app",
    "modal_app_for",
    "require_modal_token",
    "serve_dev",
    "validate_locally",
    "web_function",
]
