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
import socket
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from synth_deploy.env import Env, load_env
from synth_deploy.errors import TaskAppError, TraceStoreError
from synth_deploy.handoff import SANDBOX_APP_VAR, TASK_APP_VAR
from synth_deploy.modal._shared_records import ROLLOUT_DICT_VAR, DictRolloutRecords
from synth_deploy.modal._trace_volume import (
    CONTAINER_MEMORY_VAR,
    DEFAULT_TRACE_COMMIT_S,
    TRACE_COMMIT_VAR,
    TRACE_VOLUME_DIR_VAR,
    TRACE_VOLUME_VAR,
    VolumeSnapshots,
    modal_volume_commit,
    with_snapshots,
)
from synth_deploy.tracing import pending_limit

if TYPE_CHECKING:
    from synth_deploy.tracing import TraceDbSetting

logger = logging.getLogger("synth_deploy.modal")


def _app_file(ref: str) -> Path:
    path = Path(ref)
    if not path.is_absolute():
        path = Path(__file__).resolve().parents[2] / path
    return path


TRACING_SWITCH_VAR = "TASKAPP_TRACING_ENABLED"  # synth-ai's switch: 0 off, 1 (default) on
_OFF, _ON = ("0", "false", "no", "off"), ("1", "true", "yes", "on", "")


def tracing_enabled(env: Env) -> bool:
    """``TASKAPP_TRACING_ENABLED`` as synth-ai read it: 0 turns tracing off, 1 (default) on."""
    value = (env.get(TRACING_SWITCH_VAR) or "").strip().lower()
    if value in _OFF:
        return False
    if value in _ON:
        return True
    raise TaskAppError(f"{TRACING_SWITCH_VAR}={value!r} is neither 0 nor 1",
                       hint=f"set {TRACING_SWITCH_VAR}=0 to record nothing, 1 (the default) to "
                            "trace every rollout")


def web() -> Any:
    """Build the task app's FastAPI app from the environment Modal gives the container."""
    from synth_deploy.serving import (
        LocalRunner,
        ServeSettings,
        prepare_serving_process,
    )
    from synth_deploy.tracing import resolve_trace_db

    env = load_env(environ=os.environ)
    ref = env.get(TASK_APP_VAR)
    if not ref:
        raise TaskAppError(f"{TASK_APP_VAR} is not set in the container",
                           hint="deploy with `synth-deploy deploy` or `modal deploy <app file>`")
    # The remote libSQL store when SYNTH_TRACES_DB names one; else a SQLite file inside this
    # container, copied to the app's trace Volume when the plan gave it one.
    traces = resolve_trace_db(None, env) if tracing_enabled(env) else None
    snapshots = _volume_snapshots(env, traces)
    if traces is not None and snapshots is not None:  # read at home, from the Volume
        traces = replace(traces, session_log=True,
                         session_log_limit=pending_limit(container_memory(env)))
    settings = ServeSettings.resolve(str(_app_file(ref)), env, key_rule="required",
                                     traces=traces,
                                     trace_destination=_destination(env, traces, snapshots))
    prepare_serving_process()  # the container only serves
    if sandbox_app := env.get(SANDBOX_APP_VAR):  # its rollouts' sandboxes: modal.Sandboxes
        from synth_deploy.sandbox import ModalBackend, use_backend

        use_backend(ModalBackend(sandbox_app))
    records = shared_records(env)
    try:
        app = LocalRunner(settings, rollout_records=records).build()
    except TraceStoreError as exc:
        if settings.traces is not None and settings.traces.is_remote:
            raise  # a configured shared store that fails is a deployment error, not a detail
        logger.warning("traces are not recorded in this container: %s", exc)
        return LocalRunner(replace(settings, traces=None, trace_destination=None),
                           rollout_records=records).build()
    return app if snapshots is None else with_snapshots(app, snapshots)


CGROUP_ROOT = Path("/sys/fs/cgroup")
# cgroup v2's limit, then v1's; v1 says "no limit" with a number near 2**63.
_CGROUP_LIMITS = ("memory.max", "memory/memory.limit_in_bytes")
_NO_LIMIT_FROM = 1 << 60


def container_memory(env: Env, cgroup: Path = CGROUP_ROOT) -> int | None:
    """The container's memory in bytes: the lower of what its Modal ``memory`` setting asks
    for (`CONTAINER_MEMORY_VAR`, MiB) and its cgroup's limit, where either is known."""
    known = []
    setting = env.get(CONTAINER_MEMORY_VAR) or ""
    if setting.isdigit() and int(setting) > 0:
        known.append(int(setting) << 20)
    for name in _CGROUP_LIMITS:
        try:
            text = (cgroup / name).read_text().strip()
        except (OSError, UnicodeDecodeError):
            continue
        if text.isdigit() and 0 < int(text) < _NO_LIMIT_FROM:
            known.append(int(text))
        break  # the first file present is the hierarchy in use ("max": no limit)
    return min(known, default=None)


def shared_records(env: Env) -> DictRolloutRecords | None:
    """The records every container of the deployment shares (its `modal.Dict`), when the
    plan named one: a rollout submitted to one container is answered by any."""
    name = env.get(ROLLOUT_DICT_VAR)
    if not name:
        return None
    import modal

    return DictRolloutRecords(modal.Dict.from_name(name, create_if_missing=True))


def _volume_snapshots(env: Env, traces: TraceDbSetting | None) -> VolumeSnapshots | None:
    folder, name = env.get(TRACE_VOLUME_DIR_VAR), env.get(TRACE_VOLUME_VAR)
    if (traces is None or traces.is_remote or traces.path is None or traces.url == ":memory:"
            or not (folder and name)):
        return None
    every_s = float(env.get(TRACE_COMMIT_VAR) or DEFAULT_TRACE_COMMIT_S)
    # Modal names each container (MODAL_TASK_ID); its files on the Volume are its own.
    container = env.get("MODAL_TASK_ID") or f"{socket.gethostname()}-{os.getpid()}"
    return VolumeSnapshots(traces.path.resolve(), Path(folder), container,
                           modal_volume_commit(name), every_s)


def _destination(env: Env, traces: TraceDbSetting | None,
                 snapshots: VolumeSnapshots | None) -> dict[str, Any] | None:
    if traces is None:
        return None
    if traces.is_remote:
        return {"destination": traces.display, "durable": True}
    if snapshots is None:
        return {"destination": "this container's disk (lost with it)", "durable": False}
    held = (traces.session_log_limit or pending_limit(None)) >> 20
    return {"destination": f"Modal Volume {env.get(TRACE_VOLUME_VAR)}: {snapshots.pattern}, "
                           f"new sessions committed every {snapshots.every_s:g}s and at drain; "
                           f"up to {held} MiB held while copies fail",
            "durable": True}
