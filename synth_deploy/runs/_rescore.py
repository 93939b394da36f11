"""`rescore_app`: an app's scorer (`synth_deploy.taskapp.scoring`) applied to the sessions
a trace store holds, each result a reward version beside the recorded one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from synth_deploy.errors import UsageError

if TYPE_CHECKING:
    from synth_deploy.taskapp.config import TaskAppConfig
    from synth_deploy.tracing import RescoreResult, SessionFilter, TraceStore


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


__all__ = ["rescore_app"]
