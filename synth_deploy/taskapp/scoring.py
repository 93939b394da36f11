"""`Scorer`: how a task app scores an episode from what was stored, so a changed reward can
be applied to rollouts already run (`synth-deploy traces rescore APP`,
`synth_deploy.runs.rescore_app`) instead of running every episode again.

    @task_app.scorer(stateless=True)
    def score(session):                    # a stored `synth_deploy.tracing.SessionTrace`
        reply = session.messages[-1].content ...
        return 1.0                         # the reward; None: this session cannot be scored

A scorer reads the session as the trace store gives it back: its metadata (``seed``, the
``request`` as sent, ``metrics``), timesteps, messages, events and rewards. It is
``stateless`` when everything it needs is in the trace (a math answer checked against the
seed's problem); an app whose reward reads environment state the trace does not keep (a
world's final inventory, a sandbox's files) declares ``stateless=False`` with the reason,
and a rescore is refused unless forced (as NeMo Gym's ``reverify`` refuses a server not
declared stateless).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from synth_deploy.errors import UsageError

ScoreFunction = Callable[[Any], "float | int | None"]


@dataclass(frozen=True)
class Scorer:
    """A declared scorer: the function, whether re-running it on a trace is safe, and why
    not when it is not."""

    function: ScoreFunction
    stateless: bool = True
    reason: str | None = None  # why it is not stateless: what the trace lacks

    @property
    def name(self) -> str:
        """``task_app.py:score``: the function, as a rescore records it."""
        fn = self.function
        source = inspect.getsourcefile(fn) if inspect.isfunction(fn) else None
        where = source.rsplit("/", 1)[-1] if source else getattr(fn, "__module__", "?")
        return f"{where}:{getattr(fn, '__qualname__', type(fn).__name__)}"

    def check_rerunnable(self, app_id: str, *, force: bool) -> None:
        """Refuse a rescore of a scorer that needs what the trace does not keep, unless
        ``force``."""
        if self.stateless or force:
            return
        raise UsageError(
            f"task app {app_id!r} declares its scorer stateful: "
            f"{self.reason or 'it reads environment state the trace does not keep'}; "
            "rescoring from the stored traces could give rewards the episodes never earned",
            hint="pass --force to rescore anyway (each new version records that it was "
                 "forced), or run the episodes again")


def scorer_decorator(stateless: bool, reason: str | None,
                     declare: Callable[[Scorer], None]) -> Callable[[ScoreFunction],
                                                                    ScoreFunction]:
    """What ``@task_app.scorer(...)`` returns: the function, declared and kept as it is."""
    if not stateless and not reason:
        raise UsageError("a stateful scorer needs its reason: what the trace does not keep",
                         hint="@task_app.scorer(stateless=False, reason=\"reads the final "
                              "board, which is not traced\")")

    def decorate(fn: ScoreFunction) -> ScoreFunction:
        if not callable(fn):
            raise UsageError(f"@task_app.scorer decorates a function, got "
                             f"{type(fn).__name__}")
        if inspect.iscoroutinefunction(fn):
            raise UsageError(f"scorer {fn.__qualname__} is async: a scorer reads the stored "
                             "trace and returns the reward", hint="make it a plain def")
        declare(Scorer(fn, stateless=stateless, reason=reason))
        return fn

    return decorate


__all__ = ["ScoreFunction", "Scorer", "scorer_decorator"]
