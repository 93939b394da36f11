"""`TrainOptions`: what to submit and how patiently, resolved once and passed down unchanged."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from synth_deploy.errors import UsageError
from synth_deploy.train._backend import DEFAULT_TIMEOUT_S, RetryPolicy

DEFAULT_POLL_TIMEOUT_S = 3600.0
DEFAULT_POLL_INTERVAL_S = 5.0
DEFAULT_UPLOAD_TIMEOUT_S = 600.0
DEFAULT_UPLOAD_INTERVAL_S = 2.0


@dataclass(frozen=True)
class TrainOptions:
    """What `train()` is asked to do: the `synth-deploy train` flags, parsed and checked.

    Keys and URLs come from the `Env` handed to `train()`; a value set here wins over it:
    ``task_url`` over TASK_APP_URL (then the config's ``[services].task_url``), ``backend``
    over SYNTH_BACKEND_URL (then production). ``idempotency_key`` None mints one per job;
    with several configs a given key gets ``-1``, ``-2``… so each config is its own job.
    ``poll`` False returns once a job is created; otherwise it is followed for up to
    ``poll_timeout_s``. ``examples`` trains an SFT job on the first N examples only.
    ``allow_experimental`` is sent only when not None. Refused when built: no config, a
    non-positive poll timing, ``examples`` below 1.
    """

    configs: Sequence[Path]
    kind: str = "auto"
    task_url: str | None = None
    dataset: Path | None = None
    backend: str | None = None
    model: str | None = None
    allow_experimental: bool | None = None
    idempotency_key: str | None = None
    poll: bool = True
    poll_timeout_s: float = DEFAULT_POLL_TIMEOUT_S
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S
    examples: int | None = None
    dry_run: bool = False
    request_timeout_s: float = DEFAULT_TIMEOUT_S
    retry: RetryPolicy = RetryPolicy()
    upload_timeout_s: float = DEFAULT_UPLOAD_TIMEOUT_S
    upload_interval_s: float = DEFAULT_UPLOAD_INTERVAL_S

    def __post_init__(self) -> None:
        object.__setattr__(self, "configs", tuple(Path(p) for p in self.configs))
        if not self.configs:
            raise UsageError("no config given", hint="pass --config FILE (repeatable)")
        if self.poll_timeout_s <= 0 or self.poll_interval_s <= 0:
            raise UsageError("--poll-timeout and --poll-interval must be positive")
        if self.examples is not None and self.examples < 1:
            raise UsageError(f"--examples must be at least 1, got {self.examples}")

    @property
    def upload_poll_interval_s(self) -> float:
        """Seconds between checks that an upload is ready: a short ``poll_interval_s``
        (a quick test, an impatient user) shortens this wait too."""
        return min(self.upload_interval_s, self.poll_interval_s)


__all__ = ["TrainOptions"]
