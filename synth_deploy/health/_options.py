"""`CheckOptions` and `RolloutOptions`: what a check tries and how long it waits.

Built once (by the CLI, or by a caller such as `deploy`) and passed unchanged through
`check()`, `wait_until_healthy()` and the steps. Arguments that cannot work are refused when
the object is built, as a `UsageError` that says the fix.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from synth_deploy.errors import UsageError

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_SLOW_S = 2.0
DEFAULT_ROLLOUT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class RolloutOptions:
    """One eval-mode rollout to run: its policy calls ``inference_url`` with ``model``.

    ``timeout_s`` bounds the rollout request (never less than the per-request timeout).
    """

    inference_url: str
    model: str | None = None
    timeout_s: float = DEFAULT_ROLLOUT_TIMEOUT_S

    def __post_init__(self) -> None:
        if not self.inference_url:
            raise UsageError("a rollout check needs an inference URL",
                             hint="pass --inference-url (an OpenAI-compatible base URL) and "
                                  "--model")
        if self.timeout_s <= 0:
            raise UsageError(f"rollout timeout must be positive, got {self.timeout_s:g}")


@dataclass(frozen=True)
class CheckOptions:
    """What `check()` verifies and its time limits.

    ``seeds`` are fetched from ``/task_info`` and validated as TaskInfo (any iterable of ints,
    e.g. ``range(5)``; kept as a tuple). ``rollout``, when given, runs one eval-mode rollout;
    None leaves the rollout step out. ``timeout_s`` bounds every request; answers slower than
    ``slow_s`` pass with a warning.
    """

    seeds: tuple[int, ...] = (0,)
    rollout: RolloutOptions | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    slow_s: float = DEFAULT_SLOW_S

    # Written out so that ``seeds`` takes any iterable (a range, a list) and is kept a tuple.
    def __init__(self, seeds: Iterable[int] = (0,), rollout: RolloutOptions | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, slow_s: float = DEFAULT_SLOW_S) -> None:
        object.__setattr__(self, "seeds", tuple(int(s) for s in seeds))
        object.__setattr__(self, "rollout", rollout)
        object.__setattr__(self, "timeout_s", timeout_s)
        object.__setattr__(self, "slow_s", slow_s)
        if not self.seeds:
            raise UsageError("no seeds to check", hint="pass at least one seed, e.g. --seeds 0")
        if timeout_s <= 0:
            raise UsageError(f"timeout must be positive, got {timeout_s:g}")


__all__ = [
    "DEFAULT_ROLLOUT_TIMEOUT_S",
    "DEFAULT_SLOW_S",
    "DEFAULT_TIMEOUT_S",
    "CheckOptions",
    "RolloutOptions",
]
