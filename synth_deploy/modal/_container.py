"""What runs inside the Modal container: the task app's ASGI app.

Modal imports this module by name in the container (the function is defined at module level
and decorated by `build_modal_app`, so no pickling is involved) and calls `web()` once per
container; the package exports it as `container_app`. This is a process entry point: the
environment Modal gives the container (secrets included) is resolved here, once, and the app
is built by the same runner `serve` uses. Only the serving packages are in the image (see
`SOURCE_EXCLUDED_PACKAGES`), so nothing here may import the CLI, tunnels, runs, training or
the health checker.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from synth_deploy.env import load_env
from synth_deploy.errors import TaskAppError, TraceStoreError
from synth_deploy.handoff import TASK_APP_VAR

logger = logging.getLogger("synth_deploy.modal")


def _app_file(ref: str) -> Path:
    path = Path(ref)
    if not path.is_absolute():
        path = Path(__file__).resolve().parents[2] / path
    return path


def web() -> Any:
    """Build the task app's FastAPI app from the environment Modal gives the container."""
    from synth_deploy.serving import (
        LocalRunner,
        ServeSettings,
        prepare_serving_process,
        rollout_limits,
        server_keys,
    )
    from synth_deploy.tracing import resolve_trace_db

    env = load_env(environ=os.environ)
    ref = env.get(TASK_APP_VAR)
    if not ref:
        raise TaskAppError(f"{TASK_APP_VAR} is not set in the container",
                           hint="deploy with `synth-deploy deploy` or `modal deploy <app file>`")
    # The remote libSQL store when SYNTH_TRACES_DB names one; else a SQLite file inside this
    # container (kept only as long as the container lives, as the deploy plan says).
    settings = ServeSettings(app=str(_app_file(ref)), env=env, keys=server_keys(env, "required"),
                             traces=resolve_trace_db(None, env), rollouts=rollout_limits(env))
    prepare_serving_process()  # the container only serves
    try:
        return LocalRunner(settings).build()
    except TraceStoreError as exc:
        if settings.traces is not None and settings.traces.is_remote:
            raise  # a configured shared store that fails is a deployment error, not a detail
        logger.warning("traces are not recorded in this container: %s", exc)
        return LocalRunner(replace(settings, traces=None)).build()
