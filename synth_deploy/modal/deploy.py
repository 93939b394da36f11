"""`deploy()`: a task app from a file to a healthy URL on Modal, in one call.

    plan ─► build the modal.App offline ─► Modal token? ─► validate locally (real server +
    health check with a rollout against the mock policy) ─► `modal deploy` (bounded, streamed)
    ─► find the URL ─► wait until healthy (cold start included) ─► TASK_APP_URL in .env

A broken app stops at local validation and never reaches the cloud. `serve_dev()` runs
`modal serve` (Modal's hot-reload mode) on the same file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from synth_deploy.env import (
    DEFAULT_ENV_FILE,
    TASK_APP_URL,
    Env,
    load_env,
    write_env_var,
)
from synth_deploy.errors import DeployError
from synth_deploy.handoff import env_files_for_child
from synth_deploy.modal.builder import build_modal_app
from synth_deploy.modal.credentials import require_modal_token
from synth_deploy.modal.plan import DeployPlan, build_plan
from synth_deploy.modal.runner import (
    DEFAULT_DEPLOY_TIMEOUT_S,
    ModalCLI,
    ModalCLIError,
    explain_failure,
    find_web_url,
)

DEFAULT_HEALTH_TIMEOUT_S = 300.0

Progress = Callable[[str, str], None]


class LocalValidationError(DeployError):
    """The app failed its health check locally; ``report`` is the HealthReport."""

    def __init__(self, message: str, *, report: Any, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.report = report


@dataclass
class DeployResult:
    """What a deployment did: the plan, the URL, both health reports, the .env written."""

    plan: DeployPlan
    dry_run: bool = False
    url: str | None = None
    local_report: Any = None
    remote_report: Any = None
    env_file: Path | None = None
    output: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": True,
            "dry_run": self.dry_run,
            "url": self.url,
            "plan": self.plan.to_dict(),
            "local_check": self.local_report.to_dict() if self.local_report else None,
            "remote_check": self.remote_report.to_dict() if self.remote_report else None,
            "env_file": str(self.env_file) if self.env_file else None,
        }


def validate_locally(entry: Any, env: Env | None = None, *, seed: int = 0,
                     timeout_s: float = 30.0) -> Any:
    """Serve the app on 127.0.0.1 with an ephemeral key and health-check it, rollout included.

    The deployment's variables are applied while it runs, as they will be in the container;
    the rollout runs against the kit's mock policy, so no model endpoint is needed.
    """
    from synth_deploy.health import check
    from synth_deploy.runs import MOCK_MODEL, create_mock_policy_app
    from synth_deploy.taskapp import BackgroundServer, LocalRunner, ServeSettings, server_keys

    env = env or Env()
    settings = ServeSettings(app=str(entry.source or entry.app_id), env=env,
                             keys=server_keys(env, "ephemeral"))
    with BackgroundServer(create_mock_policy_app()) as policy, LocalRunner(settings) as server:
        return check(server.url, settings.keys.primary, seeds=(seed,), rollout=True,
                     inference_url=policy.url + "/v1", model=MOCK_MODEL, timeout_s=timeout_s,
                     key_source="an ephemeral key for local validation")


def _child_env(env: Env, env_files: Sequence[Path]) -> dict[str, str]:
    # The `modal deploy` child sees the resolved variables (Modal's credentials among them,
    # wherever they came from) and is told which env files to resolve when it rebuilds the
    # same App from the app file.
    return {**env.values, **env_files_for_child(env_files)}


def deploy(
    app: str,
    *,
    name: str | None = None,
    env_files: Iterable[str | Path] = (),
    modal_environment: str | None = None,
    dry_run: bool = False,
    check: bool = True,
    cli: ModalCLI | None = None,
    deploy_timeout_s: float = DEFAULT_DEPLOY_TIMEOUT_S,
    health_timeout_s: float = DEFAULT_HEALTH_TIMEOUT_S,
    env_out: str | Path | None = None,
    on_progress: Progress | None = None,
) -> DeployResult:
    """Deploy task app ``app`` (an id or a file) to Modal and verify it is healthy.

    ``env_files`` supply ENVIRONMENT_API_KEY and other secrets; ``dry_run`` stops after the
    plan (and an offline build of the modal.App); ``check=False`` skips both health checks.
    ``cli`` runs Modal's CLI (tests pass a stand-in); ``env_out`` is the .env that receives
    TASK_APP_URL (default: the last env file, else ./.env).
    """
    from synth_deploy.taskapp import load_app

    say = on_progress or (lambda stage, message: None)
    files = [Path(p).resolve() for p in env_files]
    env = load_env(files)
    entry = load_app(app)
    plan = build_plan(entry, env, name=name, modal_environment=modal_environment)
    build_modal_app(plan)  # settings, secrets and image must build before anything is sent
    say("plan", f"{plan.app_id} -> Modal app {plan.app_name!r} ({plan.source})")
    result = DeployResult(plan=plan, dry_run=dry_run)
    if dry_run:
        return result

    require_modal_token(env)
    if check:
        say("validate", "serving the app locally and running the health checker")
        report = validate_locally(entry, env)
        result.local_report = report
        if not report.healthy:
            failure = report.failure
            detail = (f"{failure.name}: expected {failure.expected}, got {failure.actual}"
                      if failure else "unhealthy")
            raise LocalValidationError(f"local validation failed, nothing was deployed "
                                       f"({detail})", report=report,
                                       hint=failure.hint if failure else None)
        say("validate", "healthy locally")

    say("deploy", f"modal deploy {plan.source.name} --name {plan.app_name}")
    args = ["deploy", str(plan.source), "--name", plan.app_name]
    if plan.modal_environment:
        args += ["-e", plan.modal_environment]
    run = (cli or ModalCLI()).run(args, env=_child_env(env, files), cwd=os.getcwd(),
                                  timeout_s=deploy_timeout_s, secrets=plan.secret_values(),
                                  on_line=lambda line: say("modal", line))
    result.output = run.output
    if run.returncode != 0:
        raise explain_failure(run, "modal deploy")
    url = find_web_url(run.output)
    if url is None:
        raise ModalCLIError("Modal finished, but its output names no web URL for the app",
                            hint="look for the URL in the Modal dashboard and pass it to "
                                 "`synth-deploy check --url`", output=run.output)
    result.url = url
    say("url", url)

    if check:
        from synth_deploy.health import wait_until_healthy

        say("check", f"waiting for {url} to be healthy (up to {health_timeout_s:g}s)")
        remote = wait_until_healthy(
            url, plan.api_key, timeout_s=health_timeout_s, interval_s=2.0,
            key_source="ENVIRONMENT_API_KEY",
            on_attempt=lambda n, r: say("check", f"attempt {n}: {r.summary()}"))
        result.remote_report = remote
        if not remote.healthy:
            failure = remote.failure
            raise DeployError(
                f"deployed to {url}, but it is not healthy after {health_timeout_s:g}s"
                + (f" ({failure.name}: {failure.actual})" if failure else ""),
                hint=(failure.hint if failure and failure.hint else
                      f"see `modal app logs {plan.app_name}`") + f"; {TASK_APP_URL} not written")

    target = Path(env_out) if env_out else (files[-1] if files else Path(DEFAULT_ENV_FILE))
    result.env_file = write_env_var(target, TASK_APP_URL, url)
    say("env", f"{TASK_APP_URL}={url} written to {result.env_file}")
    return result


def serve_dev(app: str, *, env_files: Iterable[str | Path] = (),
              modal_environment: str | None = None, cli: ModalCLI | None = None) -> int:
    """`modal serve` the app file (hot reload, ``-dev`` URLs) until interrupted; exit code."""
    from synth_deploy.taskapp import load_app

    files = [Path(p).resolve() for p in env_files]
    env = load_env(files)
    plan = build_plan(load_app(app), env, modal_environment=modal_environment)
    build_modal_app(plan)
    require_modal_token(env)
    args = ["serve", str(plan.source)]
    if plan.modal_environment:
        args += ["-e", plan.modal_environment]
    return (cli or ModalCLI()).run_foreground(args, env=_child_env(env, files))


__all__ = ["DEFAULT_HEALTH_TIMEOUT_S", "DeployResult", "LocalValidationError", "TASK_APP_URL",
           "deploy", "serve_dev", "validate_locally"]
