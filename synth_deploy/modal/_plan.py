"""`DeployPlan`: everything a deployment will do, resolved before anything is sent.

`--dry-run` prints it; the builder turns it into a ``modal.App``. Secret values live only in
its `SecretSource` objects and are shown masked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from synth_deploy.env import ENVIRONMENT_API_KEY, Env
from synth_deploy.errors import TaskAppError, UsageError
from synth_deploy.handoff import SANDBOX_APP_VAR, TASK_APP_VAR
from synth_deploy.modal._image import ImageRecipe, app_remote_file
from synth_deploy.modal._secrets import SecretSource, resolve_secrets
from synth_deploy.modal._settings import APP_NAME_PATTERN, FUNCTION_NAME, ModalSettings
from synth_deploy.modal._shared_records import ROLLOUT_DICT_VAR, rollout_dict_name
from synth_deploy.modal._trace_volume import (
    CONTAINER_MEMORY_VAR,
    TRACE_COMMIT_VAR,
    TRACE_VOLUME_DIR_VAR,
    TRACE_VOLUME_MOUNT,
    TRACE_VOLUME_VAR,
)
from synth_deploy.serving import HEAD_AFTER_VAR, HEARTBEAT_VAR, MAX_ROLLOUTS_VAR
from synth_deploy.tracing import TraceDbSetting, resolve_trace_db

MODAL_ENV_VAR = "MODAL_ENVIRONMENT"  # Modal's own variable: the environment to deploy into
_DNS_LABEL_MAX = 63


@dataclass(frozen=True)
class DeployPlan:
    """A resolved deployment: app, image recipe, secrets (masked when shown), resources."""

    app_id: str
    source: Path
    app_name: str
    settings: ModalSettings
    image: ImageRecipe
    secrets: tuple[SecretSource, ...]
    env: Mapping[str, str] = field(hash=False)
    tracing: str
    remote_tracing: bool
    trace_volume: str | None = None  # the Volume that keeps the traces (None: none)
    modal_environment: str | None = None
    function_name: str = FUNCTION_NAME
    warnings: tuple[str, ...] = ()  # what the settings promise beyond what was measured
    identity: Any = None  # the app's `AppIdentity`: which code the containers will run
    sandbox: Any = None  # the app's SandboxSettings: its rollouts' modal.Sandboxes (None: none)

    @property
    def api_key(self) -> str:
        """The ENVIRONMENT_API_KEY the deployed app will accept (for the health check)."""
        for source in self.secrets:
            if ENVIRONMENT_API_KEY in source.values:
                return source.values[ENVIRONMENT_API_KEY]
        raise TaskAppError("the plan holds no ENVIRONMENT_API_KEY")  # resolve_secrets ensures

    def secret_values(self) -> list[str]:
        """Every secret value in the plan, for redacting output."""
        return [v for s in self.secrets for v in s.values.values()]

    def expected_url(self, workspace: str | None = None) -> str:
        """The web URL Modal gives this function (workspace unknown offline)."""
        ws = workspace or "<workspace>"
        env = self.modal_environment
        if env and env != "main":
            ws = f"{ws}-{env}"
        label = f"{self.app_name}-{self.function_name}".lower().replace("_", "-")
        note = "" if len(label) <= _DNS_LABEL_MAX else " (label over 63 chars: Modal shortens it)"
        return f"https://{ws}--{label}.modal.run{note}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "app_id": self.app_id,
            "source": str(self.source),
            "modal_app": self.app_name,
            "function": self.function_name,
            "modal_environment": self.modal_environment,
            "expected_url": self.expected_url(),
            "image": self.image.to_dict(),
            "secrets": [s.describe() for s in self.secrets],
            "env": dict(self.env),
            "resources": self.settings.resources(),
            "tracing": self.tracing,
            "trace_volume": self.trace_volume,
            "identity": None if self.identity is None else self.identity.to_dict(),
            "sandbox": None if self.sandbox is None else {
                "backend": "modal.Sandbox", "modal_app": self.app_name,
                **self.sandbox.describe()},
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True)
class TraceDestination:
    """Where a deployed app's traces go: a remote libSQL store, a Volume, or nowhere durable."""

    traces: TraceDbSetting  # the store the deploying environment names
    app_name: str
    volume: str | None  # the trace Volume (None: remote, or turned off)
    commit_s: float  # how often each container commits its file to the Volume

    @property
    def remote(self) -> bool:
        return self.traces.is_remote

    @property
    def describe(self) -> str:
        if self.remote:
            return (f"traces go to the remote libSQL database {self.traces.display} "
                    "(SYNTH_TRACES_DB, passed as a secret)")
        if self.volume is not None:
            return (f"traces go to the Modal Volume {self.volume} (each container's new sessions "
                    f"in a file committed every {self.commit_s:g}s and at drain); fetch them with "
                    f"`synth-deploy traces pull {self.app_name}`")
        return ("traces stay inside each Modal container and are lost when it stops "
                "(ModalSettings.trace_volume=False); set SYNTH_TRACES_DB to a libsql:// URL, "
                "or drop trace_volume=False, to keep them (see infra/modal.md)")


def trace_destination(settings: ModalSettings, app_name: str, env: Env) -> TraceDestination:
    """Where the Modal app ``app_name``, deployed from ``env`` with ``settings``, records."""
    traces = resolve_trace_db(None, env)
    volume = None if traces.is_remote else settings.trace_volume_name(app_name)
    return TraceDestination(traces, app_name, volume, settings.trace_commit_s)


def deployed_trace_destination(app: str, env: Env) -> TraceDestination | None:
    """The trace destination of ``app`` when it names a task app here (an id or a file), as
    `deploy` would give it; None when it does not (``app`` is then a Modal app's own name).
    Reads no secret: pulling traces needs none of the app's."""
    from synth_deploy.errors import AppNotFoundError
    from synth_deploy.taskapp.registry import load_app

    try:
        entry = load_app(app)
    except AppNotFoundError:
        return None
    settings = entry.modal if isinstance(entry.modal, ModalSettings) else ModalSettings()
    return trace_destination(settings, settings.app_name(entry.app_id), env)


def build_plan(entry: Any, env: Env, *, name: str | None = None,
               modal_environment: str | None = None) -> DeployPlan:
    """Resolve ``entry`` (a registered TaskAppEntry) into a plan; nothing is sent anywhere.

    ``name`` overrides the settings' Modal app name; ``modal_environment`` defaults to
    MODAL_ENVIRONMENT in ``env`` (else Modal uses the profile's).
    """
    settings = entry.modal if entry.modal is not None else ModalSettings()
    if not isinstance(settings, ModalSettings):
        raise TaskAppError(f"task app {entry.app_id!r}: modal= must be a ModalSettings, got "
                           f"{type(settings).__name__}")
    if entry.source is None:
        raise TaskAppError(f"task app {entry.app_id!r} has no source file to deploy")
    source = Path(entry.source)
    app_name = name or settings.app_name(entry.app_id)
    if not APP_NAME_PATTERN.match(app_name):
        raise UsageError(f"--name: {app_name!r} is not a valid Modal app name",
                         hint="use letters, digits, '-', '_' or '.', at most 64 characters")
    destination = trace_destination(settings, app_name, env)
    sandbox = entry.build_config().sandbox
    sandbox_env = {SANDBOX_APP_VAR: app_name} if sandbox is not None else {}
    volume, remote = destination.volume, destination.remote
    volume_env: dict[str, str] = {}
    if volume is not None:
        if TRACE_VOLUME_MOUNT in settings.volumes:
            raise UsageError(f"ModalSettings.volumes.{TRACE_VOLUME_MOUNT}: the trace Volume is "
                             "mounted there", hint="mount your Volume at another path")
        volume_env = {TRACE_VOLUME_VAR: volume, TRACE_COMMIT_VAR: f"{settings.trace_commit_s:g}",
                      TRACE_VOLUME_DIR_VAR: f"{TRACE_VOLUME_MOUNT}/{app_name}"}
        if settings.memory is not None:
            volume_env[CONTAINER_MEMORY_VAR] = str(settings.memory)
    return DeployPlan(
        app_id=entry.app_id,
        source=source,
        app_name=app_name,
        settings=settings,
        image=ImageRecipe.for_app(source.parent, settings, remote_tracing=remote),
        secrets=tuple(resolve_secrets(settings, env, source.parent, destination.traces)),
        env={**settings.env, TASK_APP_VAR: app_remote_file(source), **volume_env,
             **sandbox_env,
             ROLLOUT_DICT_VAR: rollout_dict_name(app_name),
             **{var: str(value) for var, value in (
                 (MAX_ROLLOUTS_VAR, settings.max_rollouts),
                 (HEAD_AFTER_VAR, settings.head_after_s),
                 (HEARTBEAT_VAR, settings.heartbeat_s)) if value is not None}},
        tracing=destination.describe,
        remote_tracing=remote,
        trace_volume=volume,
        modal_environment=modal_environment or env.get(MODAL_ENV_VAR),
        # The digest the deployed app will report (/health, each session), worked out here
        # from the same files its image carries.
        identity=entry.build_config().identity,
        sandbox=sandbox,
    )


__all__ = ["MODAL_ENV_VAR", "DeployPlan", "TraceDestination", "build_plan",
           "deployed_trace_destination", "trace_destination"]
