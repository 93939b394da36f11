"""`Scorer`: how a task app scores an episode from what was stored, so a changed reward can
be applied to rollouts already run (`synth-deploy traces rescore APP`, `rescore_app`)
instead of running every episode again.

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
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from synth_deploy.errors import UsageError

if TYPE_CHECKING:
    from synth_deploy.taskapp.config import TaskAppConfig
    from synth_deploy.tracing import RescoreResult, SessionFilter, TraceStore

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


def rescore_app(config: TaskAppConfig, store: TraceStore, where: SessionFilter, *,
                version: str | None = None, force: bool = False,
                progress: Callable[[int, int], None] | None = None) -> RescoreResult:
    """Apply ``config``'s scorer, as its code is now, to the stored sessions ``where``
    selects (those of this app unless ``where`` names another), each result a reward
    ``version`` beside the recorded reward (`synth_deploy.tracing.rescore_sessions`).

    ``version`` defaults to the app's code digest: the same code gives the same label, and
    rescoring with it again replaces that version. Refused when the app declares no
    scorer, or a stateful one unless ``force``."""
    from synth_deploy.tracing import rescore_sessions

    scorer = config.scorer
    if scorer is None:
        raise UsageError(f"task app {config.app_id!r} declares no scorer: its rewards cannot "
                         "be given again from the stored traces",
                         hint="declare one in the app's file: @task_app.scorer, a function "
                              "(session) -> reward over the stored trace")
    scorer.check_rerunnable(config.app_id, force=force)
    identity = config.identity
    label = version or identity.digest
    if label is None:
        raise UsageError(f"task app {config.app_id!r} has no code digest to name the version",
                         hint="name it: --as LABEL")
    said = {"app_id": config.app_id, "app_version": identity.version,
            "app_digest": identity.digest, "function": scorer.name,
            "stateless": scorer.stateless, **({"forced": True} if not scorer.stateless
                                              else {})}
    if where.app is None:
        where = replace(where, app=config.app_id)
    return rescore_sessions(store, where, scorer.function, version=label, scorer=said,
                            progress=progress)


__all__ = ["ScoreFunction", "Scorer", "rescore_app", "scorer_decorator"]
