"""`deploy()`: a task app from a file to a healthy URL on Modal, in one call.

    plan ─► build the modal.App offline ─► Modal token? ─► Modal's API reachable? ─► validate
    locally (real server + health check with a rollout against the mock policy) ─► `modal
    deploy` (bounded, streamed)
    ─► find the URL ─► wait until healthy (cold start included) ─► TASK_APP_URL in .env

    env = load_env(["prod.env"])                   # resolved once, by the caller
    deploy("math", env, DeployOptions(env_files=("prod.env",), name="synth-math-prod"))

A broken app stops at local validation and never reaches the cloud. `serve_dev()` runs
`modal serve` (Modal's hot-reload mode) on the same file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from synth_deploy.env import DEFAULT_ENV_FILE, TASK_APP_URL, Env, write_env_var
from synth_deploy.errors import DeployError, UsageError
from synth_deploy.handoff import env_files_for_child
from synth_deploy.modal._credentials import require_modal_token
from synth_deploy.modal._modal_app import build_modal_app
from synth_deploy.modal._modal_cli import (
    DEFAULT_DEPLOY_TIMEOUT_S,
    ModalCLI,
    ModalCLIError,
    find_web_url,
)
from synth_deploy.modal._plan import DeployPlan, build_plan
from synth_deploy.modal._reachability import DEFAULT_CONNECT_TIMEOUT_S, require_modal_reachable

DEFAULT_HEALTH_TIMEOUT_S = 300.0

Progress = Callable[[str, str], None]


@dataclass(frozen=True)
class DeployOptions:
    """How `deploy` runs, resolved once by the caller (the CLI) and passed down.

    ``name``: the Modal app name (default: the app's ModalSettings, else ``synth-<app id>``);
    ``modal_environment``: default MODAL_ENVIRONMENT, else the Modal profile's;
    ``env_files``: the files the `Env` was resolved from, handed to the `modal` child so it
    rebuilds the same App (empty: it reads ./.env, as the caller did); ``check``: health-check
    locally before and at the URL after (False skips both); ``dry_run``: stop after the plan
    and an offline build; ``connect_timeout_s``: how long Modal's API may take to accept a
    connection before anything else is tried; ``deploy_timeout_s``: the bound on `modal deploy`;
    ``health_timeout_s``: how long the deployed app may take to become healthy (cold start
    included); ``env_out``: the .env that receives TASK_APP_URL (default: the last env file,
    else ./.env).
    """

    name: str | None = None
    modal_environment: str | None = None
    env_files: tuple[Path, ...] = ()
    check: bool = True
    dry_run: bool = False
    deploy_timeout_s: float = DEFAULT_DEPLOY_TIMEOUT_S
    health_timeout_s: float = DEFAULT_HEALTH_TIMEOUT_S
    env_out: Path | None = None
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S

    def __post_init__(self) -> None:
        object.__setattr__(self, "env_files", tuple(Path(p) for p in self.env_files))
        if self.env_out is not None:
            object.__setattr__(self, "env_out", Path(self.env_out))
        for name in ("deploy_timeout_s", "health_timeout_s", "connect_timeout_s"):
            if not getattr(self, name) > 0:
                raise UsageError(f"DeployOptions.{name}: must be more than 0 seconds, "
                                 f"got {getattr(self, name)!r}")

    @property
    def env_out_file(self) -> Path:
        """Where TASK_APP_URL is written."""
        if self.env_out is not None:
            return self.env_out
        return self.env_files[-1] if self.env_files else Path(DEFAULT_ENV_FILE)


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
    from synth_deploy.health import CheckOptions, RolloutOptions, check
    from synth_deploy.runs import serve_mock_policy
    from synth_deploy.serving import LocalRunner, ServeSettings

    env = env or Env()
    settings = ServeSettings.resolve(str(entry.source or entry.app_id), env,
                                     key_rule="ephemeral", traces=None)
    with ExitStack() as stack:
        policy, _ = serve_mock_policy(stack)
        server = stack.enter_context(LocalRunner(settings))
        rollout = RolloutOptions(inference_url=policy.inference_url, model=policy.model)
        return check(server.url, settings.keys.primary,
                     CheckOptions(seeds=(seed,), rollout=rollout, timeout_s=timeout_s),
                     key_source="an ephemeral key for local validation")


def _child_env(env: Env, env_files: Sequence[Path]) -> dict[str, str]:
    # The `modal` child sees the resolved variables (Modal's credentials among them, wherever
    # they came from) and is told which env files to resolve when it rebuilds the same App
    # from the app file.
    return {**env.values, **env_files_for_child(env_files)}


def deploy(app: str, env: Env, options: DeployOptions = DeployOptions(), *,
           cli: ModalCLI | None = None, on_progress: Progress | None = None) -> DeployResult:
    """Deploy task app ``app`` (an id or a file) to Modal and verify it is healthy.

    ``env`` supplies ENVIRONMENT_API_KEY, the other secrets and Modal's credentials;
    ``options`` say how (see `DeployOptions`). ``cli`` runs Modal's CLI (tests pass a
    stand-in); ``on_progress(stage, message)`` hears each step and Modal's output lines.
    """
    from synth_deploy.runs import capacity_warnings, measured_capacity
    from synth_deploy.taskapp.registry import load_app

    say = on_progress or (lambda stage, message: None)
    entry = load_app(app)
    plan = build_plan(entry, env, name=options.name,
                      modal_environment=options.modal_environment)
    # Held to what `rehearse` measured here (the `modal deploy` child never sees this).
    plan = replace(plan, warnings=tuple(capacity_warnings(
        plan.settings, measured_capacity(plan.app_id))))
    build_modal_app(plan)  # settings, secrets and image must build before anything is sent
    result = DeployResult(plan=plan, dry_run=options.dry_run)
    if options.dry_run:  # the caller shows the whole plan; no progress line repeats it
        return result
    say("plan", f"{plan.app_id} -> Modal app {plan.app_name!r} ({plan.source})")
    for warning in plan.warnings:
        say("capacity", warning)

    require_modal_token(env)
    say("connect", "checking that Modal's API can be reached")
    require_modal_reachable(env, options.connect_timeout_s)
    if options.check:
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
    run = (cli or ModalCLI()).run(args, env=_child_env(env, options.env_files),
                                  timeout_s=options.deploy_timeout_s,
                                  secrets=plan.secret_values(),
                                  on_line=lambda line: say("modal", line))
    result.output = run.output
    if run.returncode != 0:
        raise run.error("modal deploy")
    url = find_web_url(run.output)
    if url is None:
        raise ModalCLIError("Modal finished, but its output names no web URL for the app",
                            hint="look for the URL in the Modal dashboard and pass it to "
                                 "`synth-deploy check --url`", output=run.output)
    result.url = url
    say("url", url)

    if options.check:
        result.remote_report = _wait_until_healthy(plan, url, options.health_timeout_s, say)

    result.env_file = write_env_var(options.env_out_file, TASK_APP_URL, url)
    say("env", f"{TASK_APP_URL}={url} written to {result.env_file}")
    return result


def _wait_until_healthy(plan: DeployPlan, url: str, timeout_s: float, say: Progress) -> Any:
    from synth_deploy.health import wait_until_healthy

    say("check", f"waiting for {url} to be healthy (up to {timeout_s:g}s)")
    report = wait_until_healthy(
        url, plan.api_key, timeout_s=timeout_s, interval_s=2.0,
        key_source="ENVIRONMENT_API_KEY",
        on_attempt=lambda n, r: say("check", f"attempt {n}: {r.summary()}"))
    if not report.healthy:
        failure = report.failure
        raise DeployError(
            f"deployed to {url}, but it is not healthy after {timeout_s:g}s"
            + (f" ({failure.name}: {failure.actual})" if failure else ""),
            hint=(failure.hint if failure and failure.hint else
                  f"see `modal app logs {plan.app_name}`") + f"; {TASK_APP_URL} not written")
    return report


def serve_dev(app: str, env: Env, *, env_files: Sequence[str | os.PathLike[str]] = (),
              modal_environment: str | None = None, cli: ModalCLI | None = None,
              on_line: Callable[[str], None] | None = None,
              connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> int:
    """`modal serve` the app file (hot reload, ``-dev`` URLs) until interrupted; exit code.

    ``env`` and ``env_files`` as for `deploy` (see `DeployOptions`). Modal's output goes to
    this terminal, or, when ``on_line`` is given, to it line by line (secrets redacted).
    """
    from synth_deploy.taskapp.registry import load_app

    plan = build_plan(load_app(app), env, modal_environment=modal_environment)
    build_modal_app(plan)
    require_modal_token(env)
    require_modal_reachable(env, connect_timeout_s)  # `modal serve` would retry in silence
    args = ["serve", str(plan.source)]
    if plan.modal_environment:
        args += ["-e", plan.modal_environment]
    child_env = _child_env(env, [Path(p) for p in env_files])
    if on_line is None:
        return (cli or ModalCLI()).run_foreground(args, env=child_env)
    return (cli or ModalCLI()).run(args, env=child_env, timeout_s=None,
                                   secrets=plan.secret_values(), on_line=on_line).returncode


def app_logs(app: str, env: Env, *, follow: bool = False, tail: int | None = None,
             modal_environment: str | None = None, cli: ModalCLI | None = None,
             on_line: Callable[[str], None], connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
             timeout_s: float = 120.0) -> None:
    """A deployed app's logs, from Modal (`modal app logs`), line by line to ``on_line``
    (the app's keys redacted). ``app``: a task app id or file (its Modal app name is the
    deploy's), else a Modal app name as is. ``follow``: stream until interrupted."""
    from synth_deploy.modal._deployed import deployed_target

    target = deployed_target(app, env, modal_environment)
    name, modal_environment, secrets = target.name, target.modal_environment, target.secrets
    require_modal_token(env)
    require_modal_reachable(env, connect_timeout_s)  # `modal` would retry in silence
    args = ["app", "logs", name, *(["-f"] if follow else []),
            *(["--tail", str(tail)] if tail else []),
            *(["-e", modal_environment] if modal_environment else [])]
    run = (cli or ModalCLI()).run(args, env=_child_env(env, ()), secrets=secrets,
                                  timeout_s=None if follow else timeout_s, on_line=on_line)
    if run.returncode == 0:
        return
    if any("No App with name" in line for line in run.output):
        raise DeployError(f"Modal has no deployed app named {name!r}",
                          hint="deploy it first (synth-deploy deploy APP), or give the Modal "
                               "app's own name (synth-deploy logs synth-APP; `modal app list` "
                               "lists them), and -e/--modal-env for another environment")
    raise run.error("modal app logs")


__all__ = ["DEFAULT_HEALTH_TIMEOUT_S", "DeployOptions", "DeployResult", "LocalValidationError",
           "app_logs", "deploy", "serve_dev", "validate_locally"]
