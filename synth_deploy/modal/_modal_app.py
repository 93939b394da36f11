"""The ``modal.App`` of a task app: a `DeployPlan` turned into one ``@modal.asgi_app`` function.

Building is offline: Modal objects are lazy until deployed, so tests (and `--dry-run`) build
and inspect the same App that `modal deploy` would send. `modal_app(__file__)` is the line an
app file ends with, so that plain `modal deploy <app file>` finds the same App.
"""

from __future__ import annotations

import os
import sys
import weakref
from pathlib import Path
from typing import Any

from synth_deploy.env import Env
from synth_deploy.errors import DeployError, SynthDeployError, TaskAppError
from synth_deploy.modal._modal_cli import modal_missing
from synth_deploy.modal._plan import DeployPlan, build_plan
from synth_deploy.modal._trace_volume import TRACE_VOLUME_MOUNT

_APPS: dict[Path, Any] = {}
# App -> its web function (Modal's App.registered_functions is deprecated).
_WEB_FUNCTIONS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def build_modal_app(plan: DeployPlan) -> Any:
    """The ``modal.App`` for ``plan``: image, secrets, resources and the ASGI function."""
    try:
        import modal
    except ImportError as exc:
        raise modal_missing(exc) from exc
    from synth_deploy.modal import _container

    settings = plan.settings
    try:
        mounts = dict(settings.volumes)
        if plan.trace_volume is not None:
            mounts[TRACE_VOLUME_MOUNT] = plan.trace_volume
        volumes = {path: modal.Volume.from_name(name, create_if_missing=True)
                   for path, name in mounts.items()}
        app = modal.App(plan.app_name)
        function = modal.concurrent(max_inputs=settings.concurrent_inputs)(
            modal.asgi_app()(_container.web))
        web = app.function(
            name=plan.function_name,
            image=plan.image.to_modal(),
            secrets=[s.to_modal() for s in plan.secrets],
            env=dict(plan.env),
            timeout=settings.timeout,
            memory=settings.memory,
            cpu=settings.cpu,
            min_containers=settings.min_containers,
            max_containers=settings.max_containers,
            volumes=volumes,
            # The image recipe adds exactly the source the container needs; Modal's automatic
            # "include the defining package" would duplicate it.
            include_source=False,
        )(function)
    except SynthDeployError:
        raise
    except Exception as exc:  # Modal's InvalidError and friends: show them as ours
        raise DeployError(f"cannot build the Modal app for {plan.app_id!r}: "
                          f"{type(exc).__name__}: {exc}") from exc
    _WEB_FUNCTIONS[app] = web
    return app


def modal_app_for(app_file: str | Path, env: Env) -> Any:
    """The ``modal.App`` for the task app registered in ``app_file`` (built once, cached),
    with secrets and settings from ``env``."""
    from synth_deploy.taskapp.registry import registered_apps

    path = Path(app_file).resolve()
    if path in _APPS:
        return _APPS[path]
    entries = [e for e in registered_apps() if e.source == path]
    if len(entries) != 1:
        raise TaskAppError(f"{path} registers {len(entries)} task apps; expected exactly one",
                           hint="register exactly one task app in the file, at module level")
    plan = build_plan(entries[0], env)
    _APPS[path] = build_modal_app(plan)
    return _APPS[path]


def modal_app(app_file: str | Path) -> Any:
    """The `modal deploy` entry of a task app file, one line after its registration::

        app = modal_app(__file__)  # `modal deploy apps/math/task_app.py` deploys this

    When Modal's CLI imports the app file (`modal deploy`, `modal serve`, and the `modal`
    child of `synth-deploy deploy`) this is the ``modal.App``, its secrets and settings
    resolved from the env files `synth-deploy deploy` handed over (else ./.env). Anywhere
    else it is None and costs nothing: `synth-deploy serve`, smoke runs and the container
    running the app never build an App, nor import modal for one.
    """
    if not _imported_by_modal_cli():
        return None
    from synth_deploy.env import load_env
    from synth_deploy.handoff import env_files_from

    # The `modal` child is a process entry point: its settings are resolved here, once.
    return modal_app_for(app_file, load_env(env_files_from(os.environ)))


def _imported_by_modal_cli() -> bool:
    # Modal's CLI imports an app file through modal.cli.import_refs; in a Modal container
    # is_local() is False. Checked without importing modal: if it is not loaded yet, this is
    # not Modal's CLI.
    modal = sys.modules.get("modal")
    return ("modal.cli.import_refs" in sys.modules and modal is not None
            and bool(modal.is_local()))


def web_function(app: Any) -> Any:
    """The web function of an App made by `build_modal_app` (``.local()`` gives the ASGI app)."""
    try:
        return _WEB_FUNCTIONS[app]
    except (KeyError, TypeError):
        raise DeployError("this Modal app was not built by synth_deploy.modal") from None


__all__ = ["build_modal_app", "modal_app", "modal_app_for", "web_function"]
