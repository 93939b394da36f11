"""What is deployed: the Modal apps the kit made, listed and stopped through Modal's CLI.

    apps = deployed_apps(env)                   # `modal app list --json`, the kit's apps
    result = stop_app("math", env)              # `modal app stop synth-math -y`

As `app_logs`, these wrap Modal's CLI (`ModalCLI`: a bounded child, its output redacted)
after checking locally for a token and a reachable API (`modal` would otherwise retry in
silence for minutes). An app is named as `logs` names it: a task app id or file (its Modal
app, as `deploy` names it) or a Modal app's own name. The kit's apps are those named as
`deploy` names them by default, ``synth-<app id>``; ``every=True`` lists every app in the
environment (one deployed under ``--name`` or ``ModalSettings(name=...)`` too).

Stopping is Modal's: the app's running containers are terminated at once, without draining.
`StopResult.consequences` says what that does to the rollouts in flight and to the traces.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from synth_deploy.env import ENVIRONMENT_API_KEY, Env
from synth_deploy.errors import DeployError
from synth_deploy.modal._credentials import require_modal_token
from synth_deploy.modal._modal_cli import ModalCLI
from synth_deploy.modal._reachability import DEFAULT_CONNECT_TIMEOUT_S, require_modal_reachable

KIT_APP_PREFIX = "synth-"  # `deploy`'s default Modal app name: synth-<app id>
DEFAULT_MODAL_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class DeployedTarget:
    """The Modal app an APP argument names, and what is known of it here."""

    name: str
    modal_environment: str | None
    secrets: tuple[str, ...]  # values to redact from Modal's output
    app_id: str | None = None  # the task app's id, when APP named one here
    tracing: str | None = None  # where its traces go, when APP named a task app here
    trace_volume: str | None = None


def deployed_target(app: str, env: Env, modal_environment: str | None = None
                    ) -> DeployedTarget:
    """``app`` as a Modal app: a task app id or file here gives its plan's name, environment,
    secrets and traces (as `deploy` would resolve them); anything else is a Modal app name."""
    from synth_deploy.errors import AppNotFoundError
    from synth_deploy.modal._plan import build_plan
    from synth_deploy.taskapp.registry import load_app

    key = tuple(v for v in (env.get(ENVIRONMENT_API_KEY),) if v)
    try:
        plan = build_plan(load_app(app), env, modal_environment=modal_environment)
    except AppNotFoundError:
        return DeployedTarget(app, modal_environment, key)
    return DeployedTarget(plan.app_name, plan.modal_environment,
                          tuple(plan.secret_values()) + key, plan.app_id, plan.tracing,
                          plan.trace_volume)


@dataclass(frozen=True)
class DeployedApp:
    """One app in Modal's `modal app list`."""

    name: str
    modal_app_id: str
    state: str  # deployed · stopped · ephemeral · ... as Modal says
    containers: int  # running now
    created_at: str | None
    stopped_at: str | None

    @property
    def kits(self) -> bool:
        """Named as `deploy` names an app by default."""
        return self.name.startswith(KIT_APP_PREFIX)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "modal_app_id": self.modal_app_id, "state": self.state,
                "containers": self.containers, "created_at": self.created_at,
                "stopped_at": self.stopped_at}


def _modal(env: Env, cli: ModalCLI | None, args: list[str], *, secrets: tuple[str, ...],
           timeout_s: float, connect_timeout_s: float):
    require_modal_token(env)
    require_modal_reachable(env, connect_timeout_s)  # `modal` would retry in silence
    return (cli or ModalCLI()).run(args, env=dict(env.values), secrets=secrets,
                                   timeout_s=timeout_s)


def deployed_apps(env: Env, *, modal_environment: str | None = None, every: bool = False,
                  cli: ModalCLI | None = None, timeout_s: float = DEFAULT_MODAL_TIMEOUT_S,
                  connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> list[DeployedApp]:
    """The kit's apps in the Modal environment (``every``: all of its apps), running ones
    first, as Modal lists them."""
    from synth_deploy.modal._plan import MODAL_ENV_VAR

    modal_environment = modal_environment or env.get(MODAL_ENV_VAR)
    key = tuple(v for v in (env.get(ENVIRONMENT_API_KEY),) if v)
    run = _modal(env, cli, ["app", "list", "--json",
                            *(["-e", modal_environment] if modal_environment else [])],
                 secrets=key, timeout_s=timeout_s, connect_timeout_s=connect_timeout_s)
    if run.returncode != 0:
        raise run.error("modal app list")
    apps = [app for app in _parse_list(run.output) if every or app.kits]
    return sorted(apps, key=lambda a: (a.state != "deployed", -a.containers, a.name))


def _parse_list(lines: list[str]) -> list[DeployedApp]:
    text = "\n".join(lines)
    start = text.find("[")  # a warning may come first
    try:
        rows = json.loads(text[start:]) if start >= 0 else None
    except json.JSONDecodeError:
        rows = None
    if not isinstance(rows, list):
        raise DeployError("`modal app list --json` printed no JSON list",
                          hint="is the modal package current? (pip install -U modal)")
    apps = []
    for row in rows:
        if not isinstance(row, dict):
            continue
        tasks = str(row.get("tasks") or "0")
        apps.append(DeployedApp(str(row.get("description") or ""), str(row.get("app_id") or ""),
                                str(row.get("state") or "unknown"),
                                int(tasks) if tasks.isdigit() else 0,
                                row.get("created_at"), row.get("stopped_at")))
    return apps


@dataclass(frozen=True)
class StopResult:
    """What `stop_app` did: the app, its containers terminated, and what that means."""

    name: str
    modal_app_id: str
    containers: int  # running when it was stopped
    already_stopped: bool
    consequences: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "modal_app_id": self.modal_app_id,
                "stopped": not self.already_stopped, "already_stopped": self.already_stopped,
                "containers_terminated": 0 if self.already_stopped else self.containers,
                "consequences": list(self.consequences)}


def stop_consequences(target: DeployedTarget, containers: int) -> tuple[str, ...]:
    """What stopping ``target`` does to its rollouts in flight and its traces."""
    from synth_deploy.modal._trace_volume import DEFAULT_TRACE_COMMIT_S, default_trace_volume

    said = [f"Modal terminates its {containers} running container"
            f"{'' if containers == 1 else 's'} at once, without draining: rollouts in flight "
            "are cut (their callers see the connection close; a trainer counts them failed)",
            "its URL stops answering; `synth-deploy deploy` deploys it again (a new app, the "
            "same URL)"]
    if target.tracing is not None and target.trace_volume is None:
        said.append(target.tracing)  # remote, or kept nowhere
    else:
        volume = target.trace_volume or default_trace_volume(target.name)
        said.append(f"the trace Volume {volume} is not the app's and is kept: every session "
                    f"already copied to it stays, and `synth-deploy traces pull {target.name}` "
                    "still reads it; what a container recorded since its last copy (at most "
                    f"ModalSettings.trace_commit_s, {DEFAULT_TRACE_COMMIT_S:g}s by default) is "
                    f"lost; `modal volume delete {volume}` removes the Volume")
    return tuple(said)


def stop_app(app: str, env: Env, *, modal_environment: str | None = None,
             cli: ModalCLI | None = None,
             confirm: Callable[[DeployedApp, tuple[str, ...]], None] | None = None,
             timeout_s: float = DEFAULT_MODAL_TIMEOUT_S,
             connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> StopResult:
    """Stop the deployed Modal app ``app`` names (see `deployed_target`): `modal app stop`.
    ``confirm(app, consequences)`` is called first, and raises to keep the app running."""
    target = deployed_target(app, env, modal_environment)
    listed = deployed_apps(env, modal_environment=target.modal_environment, every=True,
                           cli=cli, timeout_s=timeout_s, connect_timeout_s=connect_timeout_s)
    found = next((a for a in listed if a.name == target.name), None)
    if found is None:
        kits = [a.name for a in listed if a.kits and a.state == "deployed"]
        where = f" in Modal environment {target.modal_environment!r}" \
            if target.modal_environment else ""
        raise DeployError(f"Modal has no app named {target.name!r}{where}",
                          hint="`synth-deploy deployed` lists the kit's apps" + (
                              f" (deployed: {', '.join(kits)})" if kits else "") +
                          "; --modal-env for another environment")
    if found.state == "stopped":
        return StopResult(found.name, found.modal_app_id, 0, True, ())
    consequences = stop_consequences(target, found.containers)
    if confirm is not None:
        confirm(found, consequences)
    run = _modal(env, cli, ["app", "stop", target.name, "-y",
                            *(["-e", target.modal_environment] if target.modal_environment
                              else [])],
                 secrets=target.secrets, timeout_s=timeout_s,
                 connect_timeout_s=connect_timeout_s)
    if run.returncode != 0:
        if any("already stopped" in line for line in run.output):  # stopped meanwhile
            return StopResult(found.name, found.modal_app_id, 0, True, ())
        raise run.error("modal app stop")
    return StopResult(found.name, found.modal_app_id, found.containers, False, consequences)


__all__ = ["DEFAULT_MODAL_TIMEOUT_S", "KIT_APP_PREFIX", "DeployedApp", "DeployedTarget",
           "StopResult", "deployed_apps", "deployed_target", "stop_app", "stop_consequences"]
