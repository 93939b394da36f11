"""What runs inside the Modal container: the task app's ASGI app.

Modal imports this module by name in the container (the function is defined at module level
and decorated by the builder, so no pickling is involved) and calls `web()` once per container.
Secrets arrive as environment variables; `SYNTH_DEPLOY_TASK_APP` names the app file relative to
the folder that holds ``synth_deploy`` (``/root`` in the container).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from synth_deploy.env import load_env
from synth_deploy.errors import TaskAppError

logger = logging.getLogger("synth_deploy.modal")


def _app_file(ref: str) -> Path:
    path = Path(ref)
    if not path.is_absolute():
        path = Path(__file__).resolve().parents[2] / path
    return path


def _trace_store(env: Any) -> Any:
    """The remote libSQL store when SYNTH_TRACES_DB names one; else a SQLite file inside this
    container (kept only as long as the container lives, as the deploy plan says)."""
    from synth_deploy.errors import TraceStoreError
    from synth_deploy.tracing import open_trace_store, resolve_trace_db

    setting = resolve_trace_db(None, env)  # env carries TURSO_AUTH_TOKEN
    try:
        return open_trace_store(setting.url, env=env)
    except TraceStoreError as exc:
        if setting.is_remote:
            raise  # a configured shared store that fails is a deployment error, not a detail
        logger.warning("traces are not recorded in this container: %s", exc)
        return None


def web() -> Any:
    """Build the task app's FastAPI app from the environment Modal gives the container."""
    from synth_deploy.modal.plan import TASK_APP_ENV
    from synth_deploy.taskapp import create_app, load_app

    env = load_env()
    ref = env.get(TASK_APP_ENV)
    if not ref:
        raise TaskAppError(f"{TASK_APP_ENV} is not set in the container",
                           hint="deploy with `synth-deploy deploy` or `modal deploy <app file>`")
    entry = load_app(str(_app_file(ref)))
    return create_app(entry.build_config(), api_keys=env.api_keys(),
                      trace_store=_trace_store(env))
