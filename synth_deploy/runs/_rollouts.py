"""Driving `/rollout` on a task app: many seeds, bounded concurrency, one report.

Used by `smoke` (mode "rl") and `eval` (mode "eval"). The runner speaks only HTTP, so it
drives a local app, a tunnel or a Modal deployment the same way. An app that advertises
synth-containers' async rollouts (``GET /containers/metadata``) gets each rollout submitted
and polled with backoff, so a long rollout costs a few short requests through any proxy;
any other app gets ``POST /rollout``. Each outcome says which path it took (`RolloutPath`).
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from synth_deploy.env import redact
from synth_deploy.serving import answered_status, failure_kind
from synth_deploy.serving import containers as durable
from synth_deploy.taskapp.contracts import NO_REWARD, recorded_reward
from synth_deploy.tls import client_ssl_context

if TYPE_CHECKING:
    from synth_deploy.tracing import CostLedger


@dataclass(frozen=True)
class PolicyTarget:
    """The OpenAI-compatible endpoint the task app should call for the policy."""

    inference_url: str
    model: str
    api_key: str | None = None
    capture_tokens: bool = False  # ask for token ids (the built-in mock returns them)

    def __repr__(self) -> str:
        return f"PolicyTarget(inference_url={self.inference_url!r}, model={self.model!r})"


@dataclass(frozen=True)
class RunOptions:
    """How a run drives the task app: the same for every seed of a smoke or eval run."""

    mode: str = "rl"  # "rl" (smoke) or "eval"
    concurrency: int = 8  # rollouts in flight
    max_time_s: float = 300.0  # each rollout's safety.max_time_s
    split: str | None = None  # env.config.split sent with each seed
    # A failed rollout whose failure says a retry may help is sent again (a new run id),
    # this many times at most; others are final.
    retries: int = 1
    # The run stops (seeds not started are not run) after this many failures in a row:
    # a dead policy or environment fails every seed alike. None: never.
    stop_after_failures: int | None = 10


@dataclass(frozen=True)
class RolloutPath:
    """How a run's rollouts reach the app (``"async"`` or ``"sync"``) and why."""

    name: str
    why: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "why": self.why}


@dataclass
class RolloutOutcome:
    """One seed's result, success or not."""

    seed: int
    run_id: str
    ok: bool
    status: int | None
    latency_s: float
    reward: float | None = None
    outcome_score: float | None = None
    events_score: float | None = None
    details: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    trace: dict[str, Any] | None = None
    tokens: int | None = None  # the rollout's LM tokens, when the app reports them
    warning: str | None = None  # e.g. its returned trace could not be stored
    ledger: CostLedger | None = None  # tokens in/out, LM, environment and wall time
    path: RolloutPath | None = None  # how it reached the app
    # A failure's: who failed (the server's classification: policy, network, environment,
    # client, store, kit) and whether sending it again may help.
    kind: str | None = None
    retryable: bool | None = None
    attempts: int = 1
    waited_s: float = 0.0  # for a slot on a full app (503 + Retry-After), before it ran
    refusals: int = 0  # those 503s
    steps: int | None = None  # the steps (turns) its metrics report

    def warn(self, text: str) -> None:
        """Add ``text`` to the outcome's warning (a rollout may earn several)."""
        self.warning = text if not self.warning else f"{self.warning}; {text}"

    def to_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "run_id": self.run_id, "ok": self.ok, "status": self.status,
                "kind": self.kind, "retryable": self.retryable, "attempts": self.attempts,
                "path": self.path.to_dict() if self.path is not None else None,
                "latency_s": round(self.latency_s, 4), "reward": self.reward,
                "outcome_score": self.outcome_score, "events_score": self.events_score,
                "tokens": self.tokens, "details": self.details, "error": self.error,
                "warning": self.warning, "waited_s": round(self.waited_s, 3),
                "refusals": self.refusals,
                "ledger": self.ledger.to_dict() if self.ledger is not None else None}


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


@dataclass
class RunReport:
    """All outcomes of a run plus the figures people look at first."""

    target_url: str
    mode: str
    concurrency: int
    outcomes: list[RolloutOutcome]
    elapsed_s: float
    notes: list[str] = field(default_factory=list)
    stopped: str | None = None  # why the run stopped before its last seed, when it did

    @property
    def errors(self) -> int:
        return sum(not o.ok for o in self.outcomes)

    @property
    def failure_kinds(self) -> dict[str, int]:
        """Failed rollouts by who failed (`RolloutOutcome.kind`), most first."""
        return failure_breakdown(self.outcomes)

    @property
    def mean_reward(self) -> float | None:
        rewards = [o.reward for o in self.outcomes if o.ok and o.reward is not None]
        return sum(rewards) / len(rewards) if rewards else None

    def _mean(self, name: str) -> float | None:
        values = [getattr(o, name) for o in self.outcomes if getattr(o, name) is not None]
        return sum(values) / len(values) if values else None

    @property
    def tokens(self) -> int | None:
        """LM tokens of all rollouts that report them (None when none does)."""
        counted = [o.tokens for o in self.outcomes if o.tokens is not None]
        return sum(counted) if counted else None

    @property
    def ledger(self) -> CostLedger | None:
        """The run's cost ledger: its rollouts' added up (None when none reports one)."""
        return run_ledger(self.outcomes)

    @property
    def latency_p50_s(self) -> float | None:
        return _percentile(sorted(o.latency_s for o in self.outcomes if o.ok), 50)

    @property
    def latency_p95_s(self) -> float | None:
        return _percentile(sorted(o.latency_s for o in self.outcomes if o.ok), 95)

    def summary(self) -> dict[str, Any]:
        return {
            "rollouts": len(self.outcomes), "ok": len(self.outcomes) - self.errors,
            "errors": self.errors, "failure_kinds": self.failure_kinds,
            "stopped": self.stopped, "mean_reward": self.mean_reward,
            "mean_outcome_score": self._mean("outcome_score"),
            "mean_events_score": self._mean("events_score"),
            "latency_p50_s": self.latency_p50_s, "latency_p95_s": self.latency_p95_s,
            "tokens": self.tokens, "warnings": sum(o.warning is not None for o in self.outcomes),
            "ledger": ledger.to_dict() if (ledger := self.ledger) is not None else None,
            "elapsed_s": round(self.elapsed_s, 3),
            "rollouts_per_s": round(len(self.outcomes) / self.elapsed_s, 2)
            if self.elapsed_s > 0 else None,
        }

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target_url, "mode": self.mode, "concurrency": self.concurrency,
                "summary": self.summary(), "notes": self.notes,
                "rollouts": [o.to_dict() for o in self.outcomes]}


def rollout_request(seed: int, policy: PolicyTarget, options: RunOptions = RunOptions(), *,
                    return_trace: bool = False) -> dict[str, Any]:
    """The RolloutRequest body a trainer would send for ``seed``."""
    config: dict[str, Any] = {"model": policy.model, "inference_url": policy.inference_url}
    if policy.api_key:
        config["api_key"] = policy.api_key
    if policy.capture_tokens:
        config["capture_tokens"] = True
    env_config: dict[str, Any] = {"split": options.split} if options.split else {}
    return {
        "run_id": f"{options.mode}-{seed}-{uuid.uuid4().hex[:8]}",
        "env": {"seed": seed, "config": env_config},
        "policy": {"policy_name": policy.model, "config": config},
        "record": {"return_trace": return_trace},
        "mode": options.mode,
        "safety": {"max_time_s": options.max_time_s},
    }


class FailureStreak:
    """Failures in a row, in the order rollouts end: past ``limit`` the run stops (`why`)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.run: list[RolloutOutcome] = []
        self.why: str | None = None

    def add(self, outcome: RolloutOutcome) -> None:
        if outcome.ok:
            self.run.clear()
            return
        self.run.append(outcome)
        if self.why is None and self.limit is not None and len(self.run) >= self.limit:
            kinds = ", ".join(f"{kind} {n}" for kind, n in failure_breakdown(self.run).items())
            self.why = f"stopped after {len(self.run)} failed rollouts in a row ({kinds})"


def failure_breakdown(outcomes: Sequence[RolloutOutcome]) -> dict[str, int]:
    """Failed ``outcomes`` by kind (``unclassified`` when the app did not say), most first."""
    counts: dict[str, int] = {}
    for outcome in outcomes:
        if not outcome.ok:
            kind = outcome.kind or "unclassified"
            counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: -item[1]))


async def run_rollouts(
    base_url: str,
    api_key: str,
    seeds: Sequence[int],
    policy: PolicyTarget,
    options: RunOptions = RunOptions(),
    *,
    return_trace: bool = False,
    on_outcome: Callable[[RolloutOutcome], None] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    bodies: Sequence[dict[str, Any]] | None = None,
    streak: FailureStreak | None = None,
) -> list[RolloutOutcome]:
    """Run one rollout per seed, at most ``options.concurrency`` at a time; outcomes in seed
    order. ``bodies[i]``, when given, is sent for ``seeds[i]`` as it is (a trainer's request:
    `rehearse`); otherwise each body is `rollout_request(seed, ...)`. A retryable failure is
    sent again up to ``options.retries`` times; once ``streak`` (by default, one of
    ``options.stop_after_failures``) stops the run, seeds not started are left out."""
    streak = streak or FailureStreak(options.stop_after_failures)
    concurrency, max_time_s = options.concurrency, options.max_time_s
    limit = asyncio.Semaphore(max(1, concurrency))
    secrets = [api_key] + ([policy.api_key] if policy.api_key else [])
    timeout = httpx.Timeout(max_time_s + 30.0, connect=10.0)
    limits = httpx.Limits(max_connections=max(1, concurrency),
                          max_keepalive_connections=max(1, concurrency))

    async with httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=timeout, limits=limits,
                                 headers={"X-API-Key": api_key}, transport=transport,
                                 follow_redirects=True, verify=client_ssl_context()) as client:
        path = await rollout_path(client)

        async def attempt(seed: int, body: dict[str, Any],
                          waits: durable.AdmissionWaits) -> RolloutOutcome:
            started = time.perf_counter()
            try:
                if path.name == "async":
                    status, data = await submit_and_poll(client, body, max_time_s, waits)
                    return _outcome(seed, body["run_id"], status, data, "",
                                    time.perf_counter() - started)
                resp = await admitted(lambda: client.post("/rollout", json=body), waits)
                return _outcome(seed, body["run_id"], resp.status_code, _json_or_none(resp),
                                resp.text, time.perf_counter() - started)
            except httpx.HTTPError as exc:  # no answer: the network's, worth another try
                return RolloutOutcome(seed, body["run_id"], False, None,
                                      time.perf_counter() - started,
                                      error=redact(transport_error(exc), secrets),
                                      kind="network", retryable=True)

        async def one(index: int, seed: int) -> RolloutOutcome | None:
            body = bodies[index] if bodies is not None else rollout_request(
                seed, policy, options, return_trace=return_trace)
            async with limit:
                if streak.why is not None:
                    return None  # the run has stopped: this seed is not run
                waits = durable.AdmissionWaits()
                outcome = await attempt(seed, body, waits)
                while not outcome.ok and outcome.retryable and \
                        outcome.attempts <= options.retries and streak.why is None:
                    # A new id: under the same one an app answers the failure it stored.
                    retried = await attempt(seed, {**body, "run_id": f"{body['run_id']}-"
                                                               f"r{outcome.attempts}"}, waits)
                    retried.attempts = outcome.attempts + 1
                    outcome = retried
            outcome.path = path
            outcome.waited_s, outcome.refusals = waits.waited_s, waits.refusals
            streak.add(outcome)
            if on_outcome is not None:
                on_outcome(outcome)
            return outcome

        ran = await asyncio.gather(*(one(i, s) for i, s in enumerate(seeds)))
        return [outcome for outcome in ran if outcome is not None]


async def rollout_path(client: httpx.AsyncClient) -> RolloutPath:
    """Which path ``client``'s app takes rollouts by: async when it advertises it."""
    try:
        resp = await client.get(durable.METADATA_PATH, timeout=30.0)
    except httpx.HTTPError as exc:
        return RolloutPath("sync", f"POST /rollout: GET {durable.METADATA_PATH} failed "
                                   f"({type(exc).__name__})")
    if resp.status_code == 200 and durable.advertises_async(_json_or_none(resp)):
        return RolloutPath("async", "submitted to /containers/rollouts and polled: the app "
                                    "advertises async rollouts, which no proxy cuts")
    return RolloutPath("sync", f"POST /rollout: the app does not advertise async rollouts "
                               f"(GET {durable.METADATA_PATH} answered {resp.status_code})")


async def admitted(send: Callable[[], Awaitable[httpx.Response]],
                   waits: durable.AdmissionWaits) -> httpx.Response:
    """``send()``'s response, sent again while a full app refuses it for a slot (503 with
    Retry-After: `AdmissionWaits` says how long to wait, and for how long in all)."""
    resp = await send()
    while (pause := waits.after(resp.status_code, resp.headers)) is not None:
        await asyncio.sleep(pause)
        resp = await send()
    return resp


async def submit_and_poll(client: httpx.AsyncClient, body: dict[str, Any],
                          max_time_s: float, waits: durable.AdmissionWaits | None = None
                          ) -> tuple[int, Any]:
    """Run ``body`` (a synth-ai rollout request) as an async rollout: (status, body) as
    ``POST /rollout`` would have answered. Each poll waits at the app up to a second for
    the rollout to end (so its end is seen as it comes); a poll that fails (a proxy's 5xx,
    a dropped connection) is asked again a few times with backoff, as the rollout runs on
    regardless."""
    submission = durable.async_submission(body)
    resp = await admitted(lambda: client.post(durable.SUBMIT_PATH, json=submission),
                          waits or durable.AdmissionWaits())
    document = _json_or_none(resp)
    if resp.status_code not in (200, 202) or not isinstance(document, dict):
        return resp.status_code, document
    where = durable.poll_path(body["run_id"])
    delay, failures = durable.FIRST_POLL_S, 0
    give_up = time.monotonic() + max_time_s + 60.0
    while document.get("status") == "running":
        if time.monotonic() > give_up:
            return 504, {"detail": {"error": {
                "code": "rollout_timeout", "message": f"rollout {body['run_id']} was still "
                f"running {max_time_s + 60:g}s after it was submitted"}}}
        try:
            resp = await client.get(where)  # a long poll: no sleep between them
        except httpx.HTTPError:
            resp = None
        if resp is None or durable.retryable(resp.status_code):
            await asyncio.sleep(delay)
            delay = durable.next_poll_delay(delay)
            failures += 1
            if failures > durable.POLL_FAILURES_ALLOWED:
                if resp is None:
                    raise httpx.ConnectError(f"polling {where} failed "
                                             f"{failures} times in a row")
                return resp.status_code, _json_or_none(resp)
            continue
        failures = 0
        document = _json_or_none(resp)
        if resp.status_code != 200 or not isinstance(document, dict):
            return resp.status_code, document
    return durable.rollout_answer(document)


def path_notes(outcomes: Sequence[RolloutOutcome]) -> list[str]:
    """A line for each path ``outcomes`` took (which, how many, and why), for a report."""
    counts: dict[RolloutPath, int] = {}
    for outcome in outcomes:
        if outcome.path is not None:
            counts[outcome.path] = counts.get(outcome.path, 0) + 1
    return [f"{n} rollout{'' if n == 1 else 's'} {path.name}: {path.why}"
            for path, n in counts.items()]


def admission_notes(outcomes: Sequence[RolloutOutcome]) -> list[str]:
    """A line saying how long rollouts waited for a slot on a full app, when any did."""
    waited = [o for o in outcomes if o.refusals]
    if not waited:
        return []
    total = sum(o.waited_s for o in waited)
    longest = max(o.waited_s for o in waited)
    refusals = sum(o.refusals for o in waited)
    return [f"{len(waited)} rollout{'' if len(waited) == 1 else 's'} waited for a slot (the "
            f"app was full: {refusals} x 503 Retry-After): {total:.1f}s in all, "
            f"{longest:.1f}s at most; raise the app's --max-rollouts or lower --concurrency "
            "to wait less"]


def _json_or_none(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return None


def _outcome(seed: int, run_id: str, status_code: int, data: Any, text: str,
             latency: float) -> RolloutOutcome:
    status = answered_status(status_code, data)
    if status != 200 or not isinstance(data, dict):
        kind, retryable = failure_kind(status, data)
        return RolloutOutcome(seed, run_id, False, status, latency,
                              error=_error_message(status, text, data), kind=kind,
                              retryable=retryable)
    metrics = data.get("metrics") if isinstance(data.get("metrics"), dict) else {}
    reward = recorded_reward(metrics)
    details = metrics.get("details") if isinstance(metrics.get("details"), dict) else {}
    trace = data.get("trace") if isinstance(data.get("trace"), dict) else None
    ledger = rollout_ledger(details.get("ledger"), trace)
    details = {k: v for k, v in details.items() if k != "ledger"}
    outcome = RolloutOutcome(seed, run_id, True, 200, latency, reward=reward,
                             outcome_score=metrics.get("outcome_score"),
                             events_score=metrics.get("events_score"), details=details,
                             trace=trace, tokens=rollout_tokens(details, trace), ledger=ledger,
                             steps=steps if _is_count(steps := metrics.get("num_steps")) else None)
    if reward is None:
        outcome.warn(NO_REWARD)
    if details.get("turn_cap") is not None:
        outcome.warn(str(details.get("ended") or f"cut at max_turns={details['turn_cap']}"))
    return outcome


def rollout_ledger(stated: Any, trace: dict[str, Any] | None) -> CostLedger | None:
    """A rollout's cost ledger: what our server put in ``details.ledger``, else one read off
    the trace it returned (any shape synth-ai apps return), else None."""
    from synth_deploy.errors import SynthDeployError
    from synth_deploy.tracing import CostLedger, ledger_of, session_from_trace

    if (ledger := CostLedger.from_dict(stated)) is not None:
        return ledger
    if not trace:
        return None
    try:
        return ledger_of(session_from_trace(trace))
    except (SynthDeployError, ValueError, TypeError, KeyError, AttributeError):
        return None


def run_ledger(outcomes: Sequence[RolloutOutcome]) -> CostLedger | None:
    """The ledgers of ``outcomes`` added up; None when none has one."""
    from synth_deploy.tracing import CostLedger

    ledgers = [o.ledger for o in outcomes if o.ledger is not None]
    return CostLedger.total(ledgers) if ledgers else None


def rollout_tokens(details: dict[str, Any], trace: dict[str, Any] | None) -> int | None:
    """A rollout's LM tokens where synth-ai's eval runner finds them: ``details.tokens``,
    else the trace's ``usage``, else the ``usage`` of its events (or their responses); and,
    past what that runner reads, an event's own ``total_tokens`` (synth-ai's v3 events)."""
    if _is_count(details.get("tokens")):
        return int(details["tokens"])
    if not trace:
        return None
    usage = trace.get("usage")
    if isinstance(usage, dict) and _is_count(usage.get("total_tokens")) \
            and usage["total_tokens"] > 0:
        return int(usage["total_tokens"])
    total = 0
    for event in trace.get("event_history") or ():
        if not isinstance(event, dict):
            continue
        for holder in (event, event.get("response"), event.get("llm_response")):
            used = holder.get("usage") if isinstance(holder, dict) else None
            if isinstance(used, dict) and _is_count(used.get("total_tokens")):
                total += int(used["total_tokens"])
                break  # one count an event: its response's usage is the same call
        else:
            if _is_count(event.get("total_tokens")):
                total += int(event["total_tokens"])
    return total or None


def _is_count(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# What a proxy's own status means, for an answer that does not say (Cloudflare's are bare).
_PROXY_STATUS = {
    524: "a proxy (Cloudflare: 100 s) cut a response that sent no byte for longer than it "
         "waits; the app must answer or send its head sooner (apps this kit serves send it "
         "after 20 s: serve --head-after S lowers it)",
    522: "the proxy could not connect to the app (Cloudflare: 522): the app or its tunnel "
         "is down",
    502: "the proxy got no valid answer from the app: it crashed or is still starting",
    504: "the gateway gave up waiting for the app",
}


def _error_message(status: int, text: str, data: Any) -> str:
    if isinstance(data, dict):
        detail = data.get("detail")
        if isinstance(detail, dict) and isinstance(detail.get("error"), dict):
            return f"HTTP {status}: {detail['error'].get('message')}"
        if detail:
            return f"HTTP {status}: {detail}"
    text = text[:200].strip()
    if status in _PROXY_STATUS:
        return f"HTTP {status}: {_PROXY_STATUS[status]}" + (f" ({text})" if text else "")
    return f"HTTP {status}: {text or 'no body'}"


def transport_error(exc: httpx.HTTPError) -> str:
    """A request that got no answer, said in words even when httpx's message is empty."""
    if str(exc):
        return f"{type(exc).__name__}: {exc}"
    if isinstance(exc, httpx.TimeoutException):
        why = "no answer within the timeout"
    elif isinstance(exc, httpx.ConnectError):
        why = "could not connect"
    else:
        why = ("the connection was closed before an answer came (the app crashed, or a "
               "proxy on the path cut it)")
    return f"{type(exc).__name__}: {why}"


__all__ = ["FailureStreak", "PolicyTarget", "RolloutOutcome", "RolloutPath", "RunOptions",
           "RunReport", "admission_notes", "admitted", "failure_breakdown",
           "path_notes", "rollout_ledger", "rollout_path", "rollout_request", "rollout_tokens",
           "run_ledger", "run_rollouts", "submit_and_poll"]
