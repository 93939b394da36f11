"""The rollout run: a validated request to a typed outcome, whichever protocol asked.

Every protocol that runs an episode (synth-ai's ``/rollout``, synth-containers' ``/containers``)
calls `RolloutRun.run` and turns the `RolloutOutcome` it returns into its own answer. The run
owns what they share: the app's rollout under its time bound, what the kit fills in, the
failure's classification (`RolloutFailure`: its status, code, kind and whether a retry can
help), how a running rollout is stopped (`RolloutStop`), and the session to the live export
and the store. Nothing is encoded as HTTP here, so nothing is read back from it.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from pydantic import ValidationError
from starlette.responses import JSONResponse

from synth_deploy.deadlines import deadline
from synth_deploy.env import known_secrets
from synth_deploy.errors import BadRequest
from synth_deploy.logs import CoalescedLog
from synth_deploy.serving._admission import RolloutStats
from synth_deploy.serving._correlation import (
    correlate,
    correlate_trace,
    correlation_id,
    session_correlation,
)
from synth_deploy.serving._failures import AppFailures
from synth_deploy.serving._responses import error_response, validation_errors
from synth_deploy.taskapp.config import RolloutContext, TaskAppConfig
from synth_deploy.taskapp.contracts import RolloutRequest, RolloutResponse
from synth_deploy.taskapp.policy import PolicyError
from synth_deploy.tracing import (
    RolloutFacts,
    SessionTrace,
    SessionTracer,
    describe_session,
    ledger_of,
)

logger = logging.getLogger("synth_deploy.taskapp")

# The hot path calls pydantic-core itself: `BaseModel.model_validate` is a Python wrapper
# that passes on its keyword defaults around the same validation.
_RESPONSE_VALIDATOR = RolloutResponse.__pydantic_validator__

# Who failed, for a client deciding what to do with a failed rollout (README, "Failure kinds").
POLICY, NETWORK, ENVIRONMENT, CLIENT, STORE, KIT = (
    "policy", "network", "environment", "client", "store", "kit")
FAILURE_KINDS = (POLICY, NETWORK, ENVIRONMENT, CLIENT, STORE, KIT)

# Why a running rollout was stopped: the code its answer and its trace carry, and whether
# the same request sent again may succeed.
STOP_REASONS = {"client_disconnected": True, "lease_expired": True, "terminated": False}
# The stops its client asked for (synth-containers' terminate, a lease let go): `cancelled`.
_CANCELLED = ("lease_expired", "terminated")


@dataclass(slots=True)
class RolloutFailure:
    """A rollout that did not complete: the HTTP ``status`` it stands for, a ``code`` and a
    ``message`` for people, who failed (``kind``, one of `FAILURE_KINDS`), whether sending
    it again may succeed (``retryable``), and protocol ``extra`` fields (run_id, errors)."""

    status: int
    code: str
    message: str
    kind: str
    retryable: bool
    extra: dict[str, Any] = field(default_factory=dict)

    def error(self) -> dict[str, Any]:
        """The error document every protocol carries (``detail.error`` in synth-ai's)."""
        return {"code": self.code, "message": self.message, **self.extra,
                "kind": self.kind, "retryable": self.retryable}

    @property
    def cancelled(self) -> bool:
        """Stopped because its client asked (terminated, its lease let go), not failed."""
        return self.code in _CANCELLED

    def response(self) -> JSONResponse:
        return error_response(self.status, self.code, self.message, **self.extra,
                              kind=self.kind, retryable=self.retryable)

    def body_after_head(self) -> bytes:
        """The error document sent once an early 200 head has gone: the status it stands
        for inside it (`answered_status` reads it)."""
        return json.dumps({"detail": {"error": {**self.error(), "status": self.status}}}
                          ).encode()


@dataclass(slots=True)
class RolloutOutcome:
    """What a run ended with: ``result`` (and ``body``, its JSON, encoded once) or
    ``failure``; ``session_id``: the session stored as this outcome, when one was;
    ``write_failed``: its store refused it (the rollout itself may have completed)."""

    run_id: str
    result: RolloutResponse | None = None
    body: bytes | None = None
    duration_s: float = 0.0  # the app's run: its wall time in the ledger and the trace
    failure: RolloutFailure | None = None
    session_id: str | None = None
    write_failed: bool = False

    @property
    def ok(self) -> bool:
        return self.failure is None


class RolloutStop:
    """How a running rollout is stopped, and why: its client left, it was terminated, or its
    lease ran out. `request` cancels ``task`` (the one running the rollout) while the app
    runs it; once its result is final (being stored) a stop changes nothing, and the rollout
    is answered as it finished. A stop asked for before ``task`` is set is kept: the task
    that takes the rollout finds ``reason`` set and does not run it."""

    __slots__ = ("task", "reason", "final")

    def __init__(self, task: asyncio.Task[Any] | None = None) -> None:
        self.task = task
        self.reason: str | None = None
        self.final = False

    def request(self, reason: str) -> bool:
        """Stop the rollout for ``reason`` (a key of `STOP_REASONS`); False when it is past
        stopping or already being stopped."""
        if self.final or self.reason is not None:
            return False
        self.reason = reason
        if self.task is not None:
            self.task.cancel()
        return True


class RolloutRun:
    """Runs validated rollout requests of one served app (see the module docstring).

    ``http``: the app's outbound client, read when a rollout starts (made at start-up)."""

    def __init__(self, config: TaskAppConfig, *, http: Callable[[], Any], trace_store: Any,
                 on_session: Callable[[SessionTrace], None] | None, failures: AppFailures,
                 stats: RolloutStats) -> None:
        self.config = config
        self.http = http
        self.call_executor = executor_caller(config.rollout)
        self.trace_store = trace_store
        self.on_session = on_session
        self.stats = stats
        self.failures = failures
        self.trace_failures = CoalescedLog(logger)  # a full disk fails every rollout

    async def run(self, req: RolloutRequest, request_json: bytes,
                  stop: RolloutStop | None = None) -> RolloutOutcome:
        """``request_json``: the body ``req`` was read from; ``stop``: how it may be stopped
        while it runs (a stopped rollout's outcome is a failure with the stop's reason)."""
        # Whether anyone reads the session past this answer: else its chat is not recorded.
        kept = self.trace_store is not None or req.record.return_trace or \
            self.on_session is not None
        tracer = SessionTracer(kept=kept)
        cid = correlation_id(req.policy.config)
        started = time.perf_counter()
        outcome = await self._played(req, tracer, stop, started, cid)
        if stop is not None:
            stop.final = True  # from here on the outcome is final: it is being stored
        session = tracer.finish(expand=False)
        result = outcome.result
        # Bytes straight from pydantic-core: no str round trip on the hot path.
        outcome.body = None if result is None else result.__pydantic_serializer__.to_json(result)
        # Building the session's metadata is wasted work when nobody reads it.
        facts = self._described(req, request_json, session, outcome, cid) if kept else None
        if self.on_session is not None:
            try:
                self.on_session(session)
            except Exception as exc:  # spans are a view of the rollout: they never fail it
                self.failures.error(exc, "live export of rollout %s failed", req.run_id,
                                    extra_secrets=_request_secrets(req))
        if self.trace_store is not None:
            await self._store(session, facts, outcome)
        # What the client waits for, the commit included.
        self.stats.record(time.perf_counter() - started)
        if outcome.ok:
            self.stats.rollouts += 1
        else:
            self.stats.errors += 1
        return outcome

    async def _played(self, req: RolloutRequest, tracer: SessionTracer,
                      stop: RolloutStop | None, started: float, cid: str | None
                      ) -> RolloutOutcome:
        """The app's rollout run under its bound: its result, or its failure classified."""
        config = self.config
        ctx = RolloutContext(request=req, config=config, tracer=tracer, http=self.http(),
                             app_state=config.app_state)
        bound = min(req.safety.max_time_s, config.max_rollout_seconds)
        outcome = RolloutOutcome(req.run_id)
        try:
            with deadline(bound):
                try:
                    raw = await self.call_executor(req, ctx)
                finally:  # what the rollout held (its sandboxes) ends with it
                    if ctx.sandboxes:
                        await ctx.close()
            outcome.duration_s = time.perf_counter() - started
            outcome.result = _completed(raw, req.run_id, tracer.finish(expand=False),
                                        wall_s=outcome.duration_s,
                                        inference_url=req.policy.config.get("inference_url"),
                                        cid=cid)
        except asyncio.CancelledError:
            if stop is None or stop.reason is None:
                raise  # the server is stopping: not this rollout's outcome to give
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            outcome.failure = stopped(stop.reason, req.run_id)
        except Exception as exc:
            outcome.failure = self._failure(exc, req, bound)
        if outcome.failure is not None:
            outcome.duration_s = time.perf_counter() - started
        return outcome

    def _described(self, req: RolloutRequest, request_json: bytes, session: SessionTrace,
                   outcome: RolloutOutcome, cid: str | None) -> RolloutFacts | None:
        """The facts the stored session is described from; None once they are applied here
        (the answer returns the trace, or the live export reads it): else the store's
        writer applies them, off the loop."""
        failure, result = outcome.failure, outcome.result
        facts = RolloutFacts(
            rollout_head(req, self.config, cid), outcome.duration_s, request_json,
            outcome.body,
            None if failure is None else failure.error(),
            "cancelled" if failure is not None and failure.cancelled else "error")
        if not (req.record.return_trace or self.on_session is not None):
            return facts
        session.expand_exchanges()
        describe_session(session, facts)
        if result is not None and req.record.return_trace and result.trace is None:
            result.trace = session.to_dict()
            correlate_trace(result.trace, cid)
            outcome.body = result.__pydantic_serializer__.to_json(result)
        return None

    async def _store(self, session: SessionTrace, facts: RolloutFacts | None,
                     outcome: RolloutOutcome) -> None:
        """Commit ``session``; a write that fails fails the rollout: a 200 promises a
        durable trace."""
        if outcome.ok:
            outcome.session_id = session.session_id
        try:
            await self.trace_store.write_session(session, rollout=facts)
            self.stats.traced += 1
        except Exception as exc:
            outcome.write_failed = True
            # Why is the operator's to read (where the file is, how full its disk), once.
            self.trace_failures.error(exc, "trace write failed for rollout %s",
                                      outcome.run_id)
            outcome.failure = RolloutFailure(
                500, "trace_write_failed", f"rollout {outcome.run_id} ran but its trace could "
                f"not be stored ({type(exc).__name__}); see the server's log", STORE, True,
                {"run_id": outcome.run_id})
            outcome.result = outcome.body = None

    async def answer_lost(self, session_id: str, run_id: str, code: str) -> None:
        """Correct the stored record of a rollout whose ``ok`` its client never got."""
        assert self.trace_store is not None  # only a stored session is corrected
        why = {"client_disconnected": "its client disconnected before the answer's last "
               "byte", "trace_write_failed": "its answer was trace_write_failed"}[code]
        error = {"code": code, "message": f"rollout {run_id} finished, but {why}",
                 "run_id": run_id}
        try:
            await self.trace_store.record_lost_answer(session_id, error)
        except Exception as exc:
            if code == "trace_write_failed":
                # The store that just failed the write fails this too (a full disk): its
                # failure is in the log already, once.
                logger.debug("rollout %s: no stored record to correct (%s)", run_id, exc)
                return
            self.trace_failures.error(exc, "could not record that rollout %s was not "
                                      "answered ok", run_id)

    def _failure(self, exc: Exception, req: RolloutRequest, bound: float) -> RolloutFailure:
        """A failed rollout, classified: 504 past its bound, 4xx for the client's mistake,
        502 when the policy failed, 500 for the app's own failure (secrets redacted)."""
        run_id = {"run_id": req.run_id}
        if isinstance(exc, TimeoutError):
            return RolloutFailure(
                504, "rollout_timeout", f"rollout {req.run_id} exceeded "
                f"safety.max_time_s={bound:g}s and was abandoned", ENVIRONMENT, True, run_id)
        if isinstance(exc, ValidationError):
            errors = validation_errors(exc)
            first = f"{errors[0]['path']}: {errors[0]['message']}" + (
                f" (and {len(errors) - 1} more)" if len(errors) > 1 else "")
            return RolloutFailure(500, "invalid_rollout_result", f"rollout {req.run_id} "
                                  f"returned a malformed RolloutResponse: {first}",
                                  ENVIRONMENT, False, {**run_id, "errors": errors})
        if isinstance(exc, BadRequest):  # the client's mistake, said by the app or the kit
            message = self._redacted(exc.message, req)
            extra: dict[str, Any] = dict(run_id)
            if exc.field:  # as `bad_request_response` says it
                extra["errors"] = [{"path": exc.field, "message": message}]
            if exc.hint:
                extra["hint"] = exc.hint
            return RolloutFailure(exc.status, exc.code, message, CLIENT, False, extra)
        if isinstance(exc, PolicyError):  # the policy endpoint failed, not the app
            message = self._redacted(exc.message, req)
            self.failures.warning(exc, "rollout %s: %s", req.run_id, message,
                                  extra_secrets=_request_secrets(req))
            return RolloutFailure(502, "policy_failed", f"rollout {req.run_id}: {message}",
                                  POLICY if exc.answered else NETWORK, exc.retryable, run_id)
        self.failures.error(exc, "rollout %s failed", req.run_id,
                            extra_secrets=_request_secrets(req))
        message = self._redacted(f"{type(exc).__name__}: {exc}", req)
        return RolloutFailure(500, "rollout_failed", f"rollout {req.run_id} failed: {message}",
                              ENVIRONMENT, False, {**run_id, "exception": type(exc).__name__})

    def _redacted(self, text: str, req: RolloutRequest) -> str:
        return self.failures.redacted(text, _request_secrets(req))


def stopped(reason: str, run_id: str) -> RolloutFailure:
    """The outcome of a rollout stopped while it ran (`RolloutStop`): a 499."""
    message = {
        "client_disconnected": f"rollout {run_id} was stopped: its client disconnected "
                               "before the answer",
        "lease_expired": f"nobody asked after rollout {run_id} for its lease: it was "
                         "cancelled",
        "terminated": f"rollout {run_id} was terminated by its client",
    }[reason]
    return RolloutFailure(499, reason, message, CLIENT, STOP_REASONS[reason],
                          {"run_id": run_id})


def rollout_head(req: RolloutRequest, config: TaskAppConfig, cid: str | None = None
                 ) -> dict[str, Any]:
    """Which rollout a stored session is, by which code of the app: the head of its
    metadata (`RolloutFacts.head`)."""
    return {"app_id": config.app_id, **config.identity.session_fields(), "run_id": req.run_id,
            "mode": req.mode, "seed": req.env.seed, "model": req.policy.config.get("model"),
            "env_name": req.env.env_name, **session_correlation(cid)}


def _request_secrets(req: RolloutRequest) -> list[str]:
    # The request's own secrets, at any depth and in its URLs: a provider may echo a key in
    # its error body, an app's exception may quote the inference_url.
    return known_secrets(req.policy.config)


_REWARD_KEYS = ("episode_rewards", "episode_returns", "outcome_reward", "reward_mean",
                "mean_return")


def _completed(raw: Any, run_id: str, session: SessionTrace, *, wall_s: float,
               inference_url: Any, cid: str | None) -> RolloutResponse:
    """The rollout's result as a response, with what the kit fills in itself, validated once.

    An author states a reward once, in metrics or with ``ctx.tracer.record_outcome_reward``:
    every protocol spelling (``episode_rewards``/``reward_mean``, ``episode_returns``/
    ``mean_return``, ``outcome_reward``, ``outcome_score``) follows from it, as do
    ``event_rewards``/``events_score`` from the recorded event rewards and ``num_steps`` from
    the timesteps. The kit adds the rollout's cost ledger (``metrics.details.ledger``: its
    tokens and time, summed by smoke/eval/rehearse summaries) and the correlation fields the
    trainer matches traces by. A rollout may return a `RolloutResponse`, a dict, or nothing.
    """
    if isinstance(raw, RolloutResponse):
        data = raw.model_dump(exclude_unset=True)
        metrics = data.get("metrics") or {}
        if not (raw.metrics.episode_rewards or raw.metrics.outcome_reward is not None):
            for name in _REWARD_KEYS:  # zeros the model filled in, not rewards the author gave
                metrics.pop(name, None)
    else:
        data = dict(raw or {})
        metrics = dict(data.get("metrics") or {})
    data["run_id"] = run_id  # the request's id, whatever the rollout said
    if metrics.get("details", {}) is None:  # said as none: the details the kit adds go in {}
        del metrics["details"]
    data["metrics"] = _filled_metrics(metrics, session)
    correlate(data, cid, inference_url)
    response = _RESPONSE_VALIDATOR.validate_python(data)
    # Added once validated: the kit's own figures need no checking (nor copying), and the
    # validated details are a dict of the response's own.
    response.metrics.details["ledger"] = ledger_of(session, wall_s=wall_s).to_dict()
    return response


def _filled_metrics(metrics: dict[str, Any], session: SessionTrace) -> dict[str, Any]:
    _fill_rewards(metrics, session)
    if session.event_rewards:
        event_values = [r.reward_value for r in session.event_rewards]
        metrics.setdefault("event_rewards", event_values)
        if metrics.get("events_score") is None:
            metrics["events_score"] = sum(event_values) / len(event_values)
    if not metrics.get("num_steps"):
        metrics["num_steps"] = len(session.timesteps)
    _fill_tokens(metrics, session)
    return metrics


def _fill_tokens(metrics: dict[str, Any], session: SessionTrace) -> None:
    """``details.tokens``: where synth-ai's eval runner looks first for a rollout's tokens
    (no trace needed)."""
    tokens = [e.total_tokens for step in session.timesteps for e in step.events
              if e.total_tokens is not None]
    details = metrics.get("details") or {}
    if tokens and isinstance(details, dict) and "tokens" not in details:
        metrics["details"] = {**details, "tokens": sum(tokens)}


def _fill_rewards(metrics: dict[str, Any], session: SessionTrace) -> None:
    """Every spelling of the outcome reward, from the one the author gave."""
    outcomes = session.outcome_rewards
    if outcomes and not any(metrics.get(k) not in (None, []) for k in _REWARD_KEYS):
        metrics["outcome_reward"] = outcomes[-1].total_reward
    if metrics.get("outcome_reward") is None:
        rewards = metrics.get("episode_rewards") or metrics.get("episode_returns")
        if rewards:
            metrics["outcome_reward"] = sum(rewards) / len(rewards)
    if metrics.get("outcome_score") is None and metrics.get("outcome_reward") is not None:
        metrics["outcome_score"] = metrics["outcome_reward"]


def executor_caller(executor: Any) -> Any:
    """An async callable running ``executor`` (decided once, not per request)."""
    if inspect.iscoroutinefunction(executor) or inspect.iscoroutinefunction(
            type(executor).__call__):
        return executor  # on the loop, where the loop watch sees a step that holds it

    async def in_thread(req: RolloutRequest, ctx: RolloutContext) -> Any:
        # A sync executor runs in a worker thread; on timeout the thread is abandoned, not
        # joined, so the client still gets its answer within the bound.
        result = await anyio.to_thread.run_sync(executor, req, ctx, abandon_on_cancel=True)
        return await maybe_await(result)

    return in_thread


async def maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


__all__ = ["FAILURE_KINDS", "RolloutFailure", "RolloutOutcome", "RolloutRun", "RolloutStop",
           "maybe_await", "rollout_head", "stopped"]
