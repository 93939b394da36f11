"""`rehearse()`: everything a training run will ask of a task app, asked first, for seconds
instead of GPU hours.

    from synth_deploy.train import load_config
    report = rehearse(load_config("rl.toml"), "math", env)        # an app id: served here
    report = rehearse(config, "https://x.modal.run", env, RehearsalOptions(idle_s=90))

In order: the app's health; one training step as the trainer runs it (groups, rewards,
failures, wall time, tokens); determinism of one seed; the capacity ramp; the timeouts a
rollout passes through; a rollout after an idle keep-alive connection (this one runs alongside
the others, since it mostly waits). The rollouts are traced like any other: a served app stores
them itself, a remote app's returned traces are stored here (``traces``); their run ids start
with ``rehearse-<tag>-``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from synth_deploy.env import Env
from synth_deploy.errors import UnreachableError, UsageError
from synth_deploy.runs import _rehearsal_checks as verdicts
from synth_deploy.runs._capacity import LoadOptions, ramp_capacity
from synth_deploy.runs._determinism import check_determinism
from synth_deploy.runs._idle import LOCAL_IDLE_S, REMOTE_IDLE_S, idle_probe
from synth_deploy.runs._measured import record_capacity
from synth_deploy.runs._rehearsal_report import CHECKS, RehearsalCheck, RehearsalReport
from synth_deploy.runs._rollouts import (
    PolicyTarget,
    RolloutOutcome,
    admission_notes,
    path_notes,
)
from synth_deploy.runs._suite import RunTarget, is_url, open_target
from synth_deploy.runs._timeouts import (
    TimeoutLayer,
    app_limit_layer,
    assess_timeouts,
    budget_layer,
    is_modal_url,
    modal_function_layer,
    modal_web_layer,
    trainer_layer,
    tunnel_layer,
)
from synth_deploy.runs._trainer_plan import TrainerPlan, plan_from_config, trainer_request
from synth_deploy.runs._training_step import run_training_step
from synth_deploy.tls import client_ssl_context
from synth_deploy.urls import is_loopback

if TYPE_CHECKING:
    from synth_deploy.tracing import TraceDbSetting

DEFAULT_BUDGET_S = 300.0  # safety.max_time_s when neither the flag nor the app states one
SKIPPABLE = ("determinism", "capacity", "idle")


@dataclass(frozen=True)
class RehearsalOptions:
    """What the config does not say.

    ``budget_s``: the ``safety.max_time_s`` sent (default: the app's limits.timeout_seconds,
    else 300 s); ``trainer_timeout_s``: the trainer's per-rollout timeout (default: the
    config's, if it states one); ``max_concurrency``: the capacity ramp's last level (default:
    twice the config's max_concurrent_rollouts, at least 8); ``idle_s``: how long the idle
    probe holds its connection (default: 6 s on loopback, 80 s remote); ``skip``: checks
    not to run (determinism, capacity, idle).
    """

    seed_start: int = 0
    budget_s: float | None = None
    trainer_timeout_s: float | None = None
    max_concurrency: int | None = None
    rollouts_per_level: int | None = None
    idle_s: float | None = None
    skip: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        unknown = set(self.skip) - set(SKIPPABLE)
        if unknown:
            raise UsageError(f"cannot skip {', '.join(sorted(unknown))}",
                             hint=f"checks that can be skipped: {', '.join(SKIPPABLE)}")
        for name in ("budget_s", "trainer_timeout_s", "idle_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise UsageError(f"{name} must be positive, got {value:g}")


@dataclass(frozen=True)
class RehearsalProgress:
    """A progress report: ``stage`` has done ``done`` of ``total`` (``errors`` failed)."""

    stage: str
    done: int
    total: int
    errors: int = 0


ProgressCallback = Callable[[RehearsalProgress], None]


def rehearse(config: Any, app_or_url: str, env: Env, options: RehearsalOptions = RehearsalOptions(),
             *, policy: PolicyTarget | None = None, traces: TraceDbSetting | None = None,
             on_progress: ProgressCallback | None = None) -> RehearsalReport:
    """Rehearse the training run of ``config`` (a loaded RL config) against ``app_or_url``.

    Raises `UnreachableError` (exit 3) when nothing answers at the URL and `UsageError` for a
    config or option that cannot work; every finding about the app is in the report.
    """
    plan = plan_from_config(config)
    started = time.perf_counter()
    with open_target(app_or_url, env, policy=policy, traces=traces) as target:
        report = RehearsalReport(target.url, plan.to_dict(), notes=list(target.notes)
                                 + list(plan.notes))
        health = _health(target, options.seed_start)
        report.checks.append(verdicts.health_check(health))
        if (lost := _traces_not_kept(health.traces)) is not None:
            report.notes.append(lost)
        if not health.healthy:
            report.checks += [RehearsalCheck(name, "skip", "not run: the app is not healthy")
                              for name in CHECKS[1:]]
        else:
            asyncio.run(_run_checks(report, target, plan, options, app_or_url,
                                    mocked=policy is None, on_progress=on_progress))
    report.elapsed_s = time.perf_counter() - started
    return report


def _health(target: RunTarget, seed: int) -> Any:
    from synth_deploy.health import EXIT_UNREACHABLE, CheckOptions, check

    report = check(target.url, target.api_key, CheckOptions(seeds=(seed,)))
    if report.exit_code == EXIT_UNREACHABLE:
        failure = report.failure
        raise UnreachableError(f"nothing answers at {target.url}: {failure.actual}",
                               hint=failure.hint)
    return report


def _traces_not_kept(traces: dict[str, Any] | None) -> str | None:
    """What to say when the app's /health shows a run's traces would be kept nowhere."""
    if traces is None:
        return None  # an app that does not say (synth-ai's): nothing to go on
    if not traces.get("enabled"):
        return ("the task app records no traces: a training run's rollouts will not be kept "
                "(serve it with tracing on, or deploy without TASKAPP_TRACING_ENABLED=0)")
    if traces.get("durable") is False:
        return (f"the task app records traces to {traces.get('destination')}: they die with "
                "the machine, so a training run's rollouts would be lost; deploy with the "
                "trace Volume (the default) or a libsql:// SYNTH_TRACES_DB")
    return None


async def _app_limits(target: RunTarget) -> tuple[float | None, float | None]:
    """The app's declared ``limits.timeout_seconds`` (/info) and when it sends a long
    rollout's head (/health ``rollouts.head_after_s``, said by apps this kit serves)."""
    found: list[float | None] = []
    async with httpx.AsyncClient(timeout=10.0, follow_redirects=True,
                                 verify=client_ssl_context()) as client:
        for path, section, name in (("/info", "limits", "timeout_seconds"),
                                    ("/health", "rollouts", "head_after_s")):
            try:
                resp = await client.get(target.url + path, headers={"X-API-Key": target.api_key})
                value = (resp.json().get(section) or {}).get(name)
            except (httpx.HTTPError, ValueError, AttributeError):
                value = None
            found.append(float(value) if isinstance(value, int | float) and value > 0 else None)
    return found[0], found[1]


def _progress(on_progress: ProgressCallback | None, stage: str, total: int
              ) -> Callable[[RolloutOutcome], None]:
    done = errors = 0
    if on_progress is not None:
        on_progress(RehearsalProgress(stage, 0, total))

    def advance(outcome: RolloutOutcome) -> None:
        nonlocal done, errors
        done, errors = done + 1, errors + (not outcome.ok)
        if on_progress is not None:
            on_progress(RehearsalProgress(stage, done, total, errors))

    return advance


async def _run_checks(report: RehearsalReport, target: RunTarget, plan: TrainerPlan,
                      options: RehearsalOptions, app_or_url: str, *, mocked: bool,
                      on_progress: ProgressCallback | None) -> None:
    app_limit, head_after_s = await _app_limits(target)
    run = _Rehearsal(target, plan, options, on_progress,
                     budget_s=options.budget_s or app_limit or DEFAULT_BUDGET_S)
    idle = run.start_idle_probe() if "idle" not in options.skip else None
    if idle is not None:  # its first rollout must not crowd the step's
        await _first_idle_rollout(run, idle)
    step = await run.training_step()
    outcomes = [o for g in step.groups for o in g.outcomes]
    report.notes += run.notes + path_notes(outcomes) + admission_notes(outcomes)
    report.checks += [verdicts.step_check(step), verdicts.signal_check(step),
                      verdicts.tokens_check(step), verdicts.sandbox_check(step)]
    report.checks.append(await run.determinism(mocked) if "determinism" not in options.skip
                         else RehearsalCheck("determinism", "skip", "skipped (--skip)"))
    entry = _app_entry(app_or_url)
    modal = entry.modal if entry is not None else None
    capacity = None
    if "capacity" in options.skip:
        report.checks.append(RehearsalCheck("capacity", "skip", "skipped (--skip)"))
    else:
        capacity = await run.capacity()
        report.checks.append(_capacity_check(capacity, entry, target, plan, mocked=mocked))
    run.idle_release.set()  # the measurements are done: the idle probe may send its second
    budget_source = _budget_source(options, app_limit)
    report.checks.append(run.timeouts(app_limit, budget_source, modal,
                                      _slowest(step, capacity, run.concurrency), head_after_s))
    report.checks.append(await _idle_check(idle, on_progress))


def _budget_source(options: RehearsalOptions, app_limit: float | None) -> str:
    """Where the rollout budget came from: --max-time, the app's limit, or the default."""
    return ("--max-time" if options.budget_s else "the app's limits.timeout_seconds"
            if app_limit else "default")


async def _first_idle_rollout(run: _Rehearsal, idle: asyncio.Task) -> None:
    """Until the idle probe's first rollout is done (or the probe ends)."""
    first = asyncio.ensure_future(run.idle_first_done.wait())
    await asyncio.wait({idle, first}, return_when=asyncio.FIRST_COMPLETED)
    first.cancel()


def _capacity_check(capacity: Any, entry: Any, target: RunTarget, plan: TrainerPlan, *,
                    mocked: bool) -> RehearsalCheck:
    """The ramp's verdict; an app served here (one process, as a container runs one) has
    its capacity kept for `deploy` to hold settings to."""
    modal = entry.modal if entry is not None else None
    check = verdicts.capacity_check(capacity, plan.max_concurrent_rollouts, modal,
                                    one_process=target.local, mocked=mocked)
    if entry is not None and target.local:
        record_capacity(entry.app_id, capacity)
    return check


async def _idle_check(idle: asyncio.Task | None,
                      on_progress: ProgressCallback | None) -> RehearsalCheck:
    """The idle probe's verdict, once its second rollout is back (skipped: said so)."""
    if idle is None:
        return RehearsalCheck("idle connection", "skip", "skipped (--skip)")
    if on_progress is not None and not idle.done():
        on_progress(RehearsalProgress("idle connection", 1, 2))
    return verdicts.idle_check(await idle)


class _Rehearsal:
    """One rehearsal's shared state: the target, the plan, the budget, the requests."""

    def __init__(self, target: RunTarget, plan: TrainerPlan, options: RehearsalOptions,
                 on_progress: ProgressCallback | None, *, budget_s: float) -> None:
        from synth_deploy.tunnel import concurrency_cap

        self.target, self.plan, self.options = target, plan, options
        self.on_progress, self.budget_s = on_progress, budget_s
        self.tag = uuid.uuid4().hex[:8]  # run ids rehearse-<tag>-…: one rehearsal's traces
        self.seed = options.seed_start
        self.secrets = (target.policy.api_key,) if target.policy.api_key else ()
        self.notes: list[str] = []
        self.concurrency, capped = concurrency_cap(target.url, plan.max_concurrent_rollouts)
        if capped:
            self.notes.append(capped)
        self.idle_first_done, self.idle_release = asyncio.Event(), asyncio.Event()

    def body(self, run_id: str, *, seed: int, cid: str | None = None,
             temperature: float | None = None, return_trace: bool = False) -> dict[str, Any]:
        return trainer_request(self.plan, seed=seed, run_id=run_id, policy=self.target.policy,
                               budget_s=self.budget_s, return_trace=return_trace, cid=cid,
                               temperature=temperature)

    def start_idle_probe(self) -> asyncio.Task:
        idle_s = self.options.idle_s or (LOCAL_IDLE_S if is_loopback(self.target.url)
                                         else REMOTE_IDLE_S)
        pair = tuple(self.body(f"rehearse-{self.tag}-idle-{i}", seed=self.seed + i)
                     for i in range(2))
        return asyncio.create_task(idle_probe(
            self.target.url, self.target.api_key, pair, idle_s, timeout_s=self.budget_s + 30,
            secrets=self.secrets, release=self.idle_release, first_done=self.idle_first_done))

    async def training_step(self) -> Any:
        return await run_training_step(
            self.target, self.plan, tag=self.tag, seed_start=self.seed, budget_s=self.budget_s,
            concurrency=self.concurrency,
            on_outcome=_progress(self.on_progress, "training step", self.plan.rollouts_per_step))

    async def determinism(self, mocked: bool) -> RehearsalCheck:
        if self.on_progress is not None:
            self.on_progress(RehearsalProgress("determinism", 0, 2))
        cid = f"rehearse-{self.tag}-det"
        result = await check_determinism(
            self.target.url, self.target.api_key, self.seed,
            lambda suffix: self.body(f"{cid}-{suffix}", seed=self.seed, cid=cid,
                                     temperature=0.0, return_trace=True),
            timeout_s=self.budget_s + 30, policy_deterministic=mocked, secrets=self.secrets)
        return verdicts.determinism_check(result)

    async def capacity(self) -> Any:
        from synth_deploy.tunnel import concurrency_cap

        wanted = self.plan.max_concurrent_rollouts
        limit, capped = concurrency_cap(self.target.url,
                                        self.options.max_concurrency or max(8, 2 * wanted))
        load = LoadOptions(max_concurrency=limit, budget_s=self.budget_s, wanted=wanted,
                           rollouts_per_level=self.options.rollouts_per_level)
        groups, store = max(1, self.plan.groups), self.target.trace_store is not None
        advance: list[Callable[[RolloutOutcome], None]] = []

        def level_started(concurrency: int, count: int) -> None:
            advance[:] = [_progress(self.on_progress, f"capacity ×{concurrency}", count)]

        def body_for(index: int, run_id: str) -> tuple[int, dict[str, Any]]:
            seed = self.seed + index % groups  # the step's seeds, round and round
            return seed, self.body(run_id, seed=seed, return_trace=store)

        capacity = await ramp_capacity(self.target, load, body_for, tag=self.tag,
                                       on_level_start=level_started,
                                       on_outcome=lambda outcome: advance[0](outcome))
        if capped:
            capacity.notes.append(capped)
        return capacity

    def timeouts(self, app_limit: float | None, budget_source: str, modal: Any,
                 slowest_s: float | None, head_after_s: float | None) -> RehearsalCheck:
        options, plan = self.options, self.plan
        trainer_s = options.trainer_timeout_s or plan.trainer_timeout_s
        trainer_source = ("--trainer-timeout" if options.trainer_timeout_s
                          else plan.trainer_timeout_source)
        layers = _timeout_layers(self.target.url, self.budget_s, budget_source, app_limit,
                                 modal, trainer_s, trainer_source)
        passed = _proxies_passed(layers, head_after_s)
        if passed:
            layers = [layer for layer in layers if not layer.proxy]
        assessment = assess_timeouts(layers, self.budget_s, slowest_s)
        if passed:
            names = " and ".join(f"the {layer.name} ({layer.seconds:g}s)" for layer in passed)
            assessment.notes.append(f"the app sends a long rollout's head after "
                                    f"{head_after_s:g}s, then a byte at intervals: {names} "
                                    "never see it silent")
        assessment.notes += _unchecked_timeouts(trainer_s, modal, layers)
        return verdicts.timeouts_check(assessment)


def _unchecked_timeouts(trainer_s: float | None, modal: Any, layers: list[TimeoutLayer]
                        ) -> list[str]:
    """Notes on the timeouts that could not be checked, and how to check them."""
    notes = []
    if trainer_s is None:
        notes.append("the trainer's per-rollout timeout is not in the config: "
                     "pass --trainer-timeout S to check it too")
    if modal is None and any(layer.name.startswith("Modal") for layer in layers):
        notes.append("the Modal function timeout is not known from a URL: "
                     "rehearse with --app to check the app's "
                     "ModalSettings(timeout=...)")
    return notes


def _proxies_passed(layers: list[TimeoutLayer], head_after_s: float | None
                    ) -> list[TimeoutLayer]:
    """The proxy layers, when the app's early head passes every one of them (else none):
    proxies cut silence, not length."""
    proxies = [layer for layer in layers if layer.proxy]
    if head_after_s is None or not all(head_after_s < layer.seconds for layer in proxies):
        return []
    return proxies


def _slowest(step: Any, capacity: Any, concurrency: int) -> float | None:
    """The slowest rollout at the trainer's concurrency or below (the step, the ramp)."""
    latencies = [o.latency_s for o in step.outcomes]
    if capacity is not None:
        latencies += [o.latency_s for level in capacity.levels if level.concurrency
                      <= concurrency for o in level.outcomes]
    return max(latencies, default=None)


def _app_entry(app_or_url: str) -> Any:
    """The registered app when it is served from its id or file, else None."""
    if is_url(app_or_url):
        return None
    from synth_deploy.taskapp.registry import load_app

    return load_app(app_or_url)


def _timeout_layers(url: str, budget_s: float, budget_source: str, app_limit: float | None,
                    modal: Any, trainer_s: float | None, trainer_source: str | None
                    ) -> list[TimeoutLayer]:
    from synth_deploy.tunnel import TUNNEL_RESPONSE_TIMEOUT_S, is_quick_tunnel

    layers = [budget_layer(budget_s, f"safety.max_time_s ({budget_source})")]
    if app_limit is not None:
        layers.append(app_limit_layer(app_limit))
    if modal is not None:
        layers.append(modal_function_layer(float(modal.timeout),
                                           "the app's ModalSettings(timeout=...)"))
    if modal is not None or is_modal_url(url):
        layers.append(modal_web_layer())
    if is_quick_tunnel(url):
        layers.append(tunnel_layer(float(TUNNEL_RESPONSE_TIMEOUT_S)))
    if trainer_s is not None:
        layers.append(trainer_layer(trainer_s, trainer_source or "the config"))
    return layers


__all__ = ["DEFAULT_BUDGET_S", "SKIPPABLE", "RehearsalOptions", "RehearsalProgress", "rehearse"]
