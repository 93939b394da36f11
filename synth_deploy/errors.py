"""The one error tree of synth-deploy.

    SynthDeployError                 every error the kit raises on purpose
     ├── UsageError                  bad flags, files or values given by the user (exit 2)
     │    ├── EnvFileError           a .env line that cannot be parsed
     │    └── AppNotFoundError       an app id or path that names no task app
     ├── TaskAppError                a task app that fails to load or build
     ├── BadRequest                  a task app refusing one request: answered 4xx, not 500
     │    └── InvalidAction          an environment refusing an action (nothing changed)
     ├── HealthError                 the health checker could not run
     ├── UnreachableError            nothing answers at a task app's URL (exit 3)
     ├── TunnelError                 cloudflared missing, failing or dying (carries its logs)
     ├── DeployError                 Modal deployment failures
     ├── TraceStoreError             the trace database cannot be opened, read or written
 ├── SandboxError                a sandbox could not be made, or is used after it ended
     └── JobError                    training backend and job failures
          └── JobHTTPError           a non-2xx answer from the backend (status, body)

Each error carries a ``hint`` (the fix, one sentence) and an ``exit_code`` the CLI uses.
Messages never contain secret values: callers mask them before raising.
"""

from __future__ import annotations


class SynthDeployError(Exception):
    """Base of every error synth-deploy raises on purpose."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class UsageError(SynthDeployError):
    """The user gave a flag, file or value that cannot work."""

    exit_code = 2


class EnvFileError(UsageError):
    """A .env file has a line that cannot be parsed."""


class AppNotFoundError(UsageError):
    """No task app is registered under the given id, or the path holds none."""


class TaskAppError(SynthDeployError):
    """A task app module failed to import or its config failed to build."""


class BadRequest(SynthDeployError):
    """Raise it from a rollout or `@task_app.instances` to refuse a request the client got
    wrong (a seed the dataset lacks, a config value out of range): the server answers
    ``status`` (4xx) with ``code``, the message and ``field`` (where in the request, e.g.
    ``"env.seed"``), instead of the 500 an unexpected exception gets.

        raise BadRequest("max_turns must be 1-5", field="env.config.max_turns")
    """

    def __init__(self, message: str, *, status: int = 422, code: str = "bad_request",
                 field: str | None = None, hint: str | None = None) -> None:
        if not 400 <= status <= 499:
            raise ValueError(f"BadRequest status must be 4xx, got {status}")
        super().__init__(message, hint=hint)
        self.status, self.code, self.field = status, code, field


class InvalidAction(BadRequest):
    """Raise it from an environment's ``step`` to refuse an action, before anything changed:
    in an episode the kit derives, the policy is told the message and asked once more; over
    OpenEnv's wire the client gets a validation error (422)."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message, code="invalid_action", field="action", hint=hint)


class HealthError(SynthDeployError):
    """The health checker itself could not run (not: the app is unhealthy)."""


class UnreachableError(SynthDeployError):
    """Nothing answers at the task app's URL (DNS, connect or TLS failed)."""

    exit_code = 3


class TunnelError(SynthDeployError):
    """cloudflared is missing, failed to start, or died; ``logs`` holds its recent lines."""

    def __init__(self, message: str, *, hint: str | None = None, logs: list[str] | None = None):
        super().__init__(message, hint=hint)
        self.logs = list(logs or [])


class DeployError(SynthDeployError):
    """A Modal build or deployment failed."""


class TraceStoreError(SynthDeployError):
    """The trace database cannot be opened, migrated, read or written."""


class SandboxError(SynthDeployError):
    """A sandbox could not be made or reached, or was used after it ended. What the code in
    it does (a failing command, a limit hit) is its result, not this error."""


class JobError(SynthDeployError):
    """A training job could not be prepared, submitted or followed."""


class JobHTTPError(JobError):
    """The training backend answered with a non-2xx status."""

    def __init__(
        self,
        message: str,
        *,
        status: int,
        body: str = "",
        payload: object | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.status = status
        self.body = body
        self.payload = payload


__all__ = [
    "AppNotFoundError",
    "BadRequest",
    "DeployError",
    "EnvFileError",
    "HealthError",
    "InvalidAction",
    "JobError",
    "JobHTTPError",
    "SandboxError",
    "SynthDeployError",
    "TaskAppError",
    "TraceStoreError",
    "TunnelError",
    "UnreachableError",
    "UsageError",
]
