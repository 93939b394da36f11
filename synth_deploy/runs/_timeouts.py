"""Timeouts in the right order: each layer a rollout passes through must wait longer than the
one inside it, and every layer longer than rollouts really take.

From the inside out:

    rollout budget   safety.max_time_s the trainer sends; the app answers 504 when it is spent
    app limit        the app's declared limits.timeout_seconds (/info)
    Modal function   ModalSettings.timeout: Modal kills the request, no answer at all
    Modal web        150 s, then a 303 to a result URL the client must follow
    tunnel           Cloudflare answers 524 after 125 s without a response byte
    (both from synth_deploy.proxy_limits)
    trainer          the trainer's per-rollout timeout: it gives up and counts a failure

A layer shorter than the rollouts measured fails the check (those rollouts would be lost); a
layer shorter than the budget inside it is inverted (a slow rollout dies there without the
app's clean 504) and is a warning with the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from synth_deploy.proxy_limits import MODAL_WEB_REDIRECT_S


@dataclass(frozen=True)
class TimeoutLayer:
    """One timeout a rollout passes through: how long, set where, and what happens."""

    name: str
    seconds: float
    source: str
    on_expiry: str
    fix: str
    inner: bool = False  # the budget itself (the app enforces it): nothing sits inside it
    hard: bool = True  # False: passing it is survivable (Modal's 303 redirect)
    proxy: bool = False  # a proxy's limit on a silent answer: an early head passes it

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "seconds": self.seconds, "source": self.source,
                "on_expiry": self.on_expiry}


@dataclass
class TimeoutAssessment:
    """The layers in order, what the rollouts measured, and what is wrong."""

    layers: list[TimeoutLayer]
    budget_s: float
    observed_max_s: float | None
    outlived: list[str] = field(default_factory=list)  # failures: rollouts die there
    inverted: list[str] = field(default_factory=list)  # warnings: a slow rollout would
    fixes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"layers": [layer.to_dict() for layer in self.layers],
                "budget_s": self.budget_s, "observed_max_s": None
                if self.observed_max_s is None else round(self.observed_max_s, 3),
                "outlived": self.outlived, "inverted": self.inverted, "fixes": self.fixes,
                "notes": self.notes}


def assess_timeouts(layers: list[TimeoutLayer], budget_s: float,
                    observed_max_s: float | None) -> TimeoutAssessment:
    """Check ``layers`` (inside first) against the budget and the slowest rollout seen."""
    ordered = sorted(layers, key=lambda layer: (not layer.inner, layer.seconds))
    result = TimeoutAssessment(ordered, budget_s, observed_max_s)
    for layer in ordered:
        if observed_max_s is not None and layer.hard and observed_max_s > layer.seconds:
            result.outlived.append(
                f"rollouts took up to {observed_max_s:.2f}s, longer than the {layer.name} "
                f"({layer.seconds:g}s, {layer.source}): {layer.on_expiry}")
            result.fixes.append(layer.fix)
        elif not layer.inner and layer.seconds < budget_s:
            result.inverted.append(
                f"the {layer.name} ({layer.seconds:g}s) is shorter than the rollout "
                f"budget ({budget_s:g}s): a rollout slower than {layer.seconds:g}s "
                f"{layer.on_expiry}")
            result.fixes.append(layer.fix)
    return result


def budget_layer(budget_s: float, source: str) -> TimeoutLayer:
    return TimeoutLayer(
        "rollout budget", budget_s, source, "is abandoned by the app (HTTP 504)",
        "make the rollout faster, or raise safety.max_time_s (and the app's limits) to fit it",
        inner=True)


def app_limit_layer(seconds: float) -> TimeoutLayer:
    return TimeoutLayer(
        "app's declared limit", seconds, "the app's limits.timeout_seconds (/info)",
        "breaks the limit the app promises",
        "raise limits.timeout_seconds in the app's TaskApp(...) to what rollouts take, or "
        "shorten them", inner=True)


def modal_function_layer(seconds: float, source: str) -> TimeoutLayer:
    return TimeoutLayer(
        "Modal function timeout", seconds, source,
        "is killed by Modal with no answer (the trainer sees a dropped connection)",
        f"raise ModalSettings(timeout=...) above the rollout budget, or lower "
        f"safety.max_time_s below {seconds:g}s")


# Modal answers a web request that runs longer with a 303 to a result URL (clients must
# follow); its web endpoints are served under this domain. The layers are the only users of
# these facts of Modal's: deploying (synth_deploy.modal) has no use for them.
MODAL_WEB_TIMEOUT_S = MODAL_WEB_REDIRECT_S
MODAL_WEB_SUFFIX = ".modal.run"


def is_modal_url(url: str) -> bool:
    """True when ``url`` is a Modal web endpoint (``https://…modal.run``)."""
    host = (urlsplit(url).hostname or "").lower()
    return host.endswith(MODAL_WEB_SUFFIX)


def modal_web_layer(seconds: float = MODAL_WEB_TIMEOUT_S) -> TimeoutLayer:
    return TimeoutLayer(
        "Modal web request limit", seconds, "Modal (all web endpoints)",
        "is answered with a 303 redirect to a result URL: the trainer's client must follow "
        "redirects", "serve the app with synth-deploy (it answers a long rollout's head "
        "early), make sure the trainer's HTTP client follows 303 redirects, or keep "
        f"rollouts under {seconds:g}s", hard=False, proxy=True)


def tunnel_layer(seconds: float) -> TimeoutLayer:
    return TimeoutLayer(
        "tunnel response timeout", seconds, "Cloudflare (quick and named tunnels)",
        "is cut by Cloudflare with HTTP 524",
        "serve the app with synth-deploy (it answers a long rollout's head early and keeps "
        f"the answer alive), or keep rollouts under {seconds:g}s", proxy=True)


def trainer_layer(seconds: float, source: str) -> TimeoutLayer:
    return TimeoutLayer(
        "trainer's per-rollout timeout", seconds, source,
        "is given up by the trainer and counted as a failure while the app keeps working",
        "raise the trainer's per-rollout timeout above the rollout budget, or lower "
        "safety.max_time_s below it")


__all__ = ["MODAL_WEB_TIMEOUT_S", "TimeoutAssessment", "TimeoutLayer", "app_limit_layer",
           "assess_timeouts", "budget_layer", "is_modal_url", "modal_function_layer",
           "modal_web_layer", "trainer_layer", "tunnel_layer"]
