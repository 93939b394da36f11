"""`create_app(config)`: a task app's HTTP server, every endpoint of the protocol spec.

Handlers take the raw `Request` and answer `Response` objects: the hot path (`/rollout`)
validates with pydantic-core straight from bytes and skips FastAPI's dependency machinery,
which is where most of synth-ai's per-request overhead goes.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import Any, Protocol

import anyio
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from synth_deploy.deadlines import deadline
from synth_deploy.env import Env, known_secrets
from synth_deploy.errors import BadRequest
from synth_deploy.logs import CoalescedLog
from synth_deploy.serving._admission import InFlight, RolloutLimits, RolloutStats
from synth_deploy.serving._auth import ApiKeyAuth
from synth_deploy.serving._blocking import LoopWatch, app_code
from synth_deploy.serving._correlation import (
    correlate,
    correlate_trace,
    correlation_id,
    session_correlation,
)
from synth_deploy.serving._failures import AppFailures
from synth_deploy.serving._openapi import json_body, schema_ref, seed_parameters, task_info_schema
from synth_deploy.serving._protocol_app import new_protocol_app
from synth_deploy.serving._proxy import VENDOR_KEYS
from synth_deploy.serving._request_guards import (
    BodyTooLarge,
    bad_request_response,
    http_error,
    read_body,
    requested_seeds,
)
from synth_deploy.serving._responses import error_response, validation_errors
from synth_deploy.serving._rollout_endpoint import RolloutEndpoint
from synth_deploy.serving._routes import Endpoint, guarded_routes
from synth_deploy.serving.containers._durable import AsyncRollouts
from synth_deploy.serving.containers._wire import containers_endpoints
from synth_deploy.serving.openenv._wire import openenv_endpoints, openenv_sessions
from synth_deploy.taskapp._outbound import open_outbound
from synth_deploy.taskapp.config import RolloutContext, TaskAppConfig
from synth_deploy.taskapp.contracts import (
    RolloutRequest,
    RolloutResponse,
    TaskInfo,
)
from synth_deploy.taskapp.policy import PolicyError
from synth_deploy.tracing import (
    RolloutFacts,
    RolloutRecords,
    SessionTrace,
    SessionTracer,
    describe_session,
    ledger_of,
)

logger = logging.getLogger("synth_deploy.taskapp")

# The hot path calls pydantic-core itself: `BaseModel.model_validate` and `model_dump` are
# Python wrappers that pass on their keyword defaults around the same validation.
_RESPONSE_VALIDATOR = RolloutResponse.__pydantic_validator__


class TraceSink(Protocol):
    """Where a served app's finished sessions go: the kit's `TraceStore`, or any object with
    these three methods. ``start`` is called once as the server starts; ``write_session``
    returns once the session is durable. ``rollout``, when given, holds the facts the session
    is described from (`describe_session`), which the sink applies before it stores it: the
    store does so in its writer child, off the server's loop."""

    def start(self) -> None: ...

    async def write_session(self, session: SessionTrace,
                            rollout: RolloutFacts | None = None) -> None: ...

    async def record_lost_answer(self, session_id: str, error: dict[str, Any]) -> None:
        """The session written as ``ok`` was not what its client got: ``error`` was."""


class _EncodedJSON(Response):
    """A 200 whose body is JSON already encoded. Its two headers are spelled out: `Response`
    works them out for any media type and extra headers, half the cost of building one."""

    media_type = "application/json"

    def init_headers(self, headers: Mapping[str, str] | None = None) -> None:
        self.raw_headers = [(b"content-length", b"%d" % len(self.body)),
                            (b"content-type", b"application/json")]


def create_app(
    config: TaskAppConfig,
    *,
    api_keys: Sequence[str] | None,
    trace_store: TraceSink | None = None,
    env: Env | None = None,
    on_session: Callable[[SessionTrace], None] | None = None,
    limits: RolloutLimits = RolloutLimits(),
    trace_destination: Mapping[str, Any] | None = None,
    rollout_records: RolloutRecords | None = None,
) -> Starlette:
    """Build the ASGI app for ``config`` (a FastAPI app when it has routers).

    ``api_keys``: the keys clients must send (see `server_keys` for where they come from);
    ``None`` turns authentication off, an empty list answers 503 on authenticated endpoints.
    ``trace_store``: when given, every rollout is committed to it before its response is sent.
    ``env``: resolved settings; the vendor proxies take their keys from it.
    ``on_session``: called with each finished rollout's session as it goes to the store (the
    live OTLP export); it must return at once, and its failure never fails a rollout.
    ``limits``: how many rollouts run at once, and when a long one's head is sent.
    ``trace_destination``: where the traces end up, as /health says it (``destination``:
    for humans, ``durable``: whether they outlive this process's machine).
    ``rollout_records``: where async rollouts (synth-containers' contract, `/containers`)
    keep their records, to be answered after a restart; None keeps them in memory.
    """
    env = env or Env()
    auth = ApiKeyAuth(api_keys)
    # Values that must never leave in an error or a log: our keys and the vendor keys.
    secret_values = list(api_keys or ())
    if config.proxy is not None:
        secret_values += [v for v in (env.get(name) for name in VENDOR_KEYS) if v]
    failures = AppFailures(secret_values)

    # OpenEnv's episode sessions (an app that declares an environment): the episodes still
    # open when the server stops are closed, and traced, before the app's shutdown hooks.
    env_sessions = openenv_sessions(config, capacity=limits.max_in_flight, failures=failures,
                                    trace_store=trace_store, on_session=on_session)

    @asynccontextmanager
    async def lifespan(app: Starlette):
        app.state.http = await open_outbound(allow_link_local=config.allow_link_local,
                                             max_connections=limits.max_in_flight)
        if trace_store is not None:
            trace_store.start()
        # Names the app's code that holds it, installed as a package or not.
        roots = app_code(config.rollout, config.provide_task_instances,
                         *([config.environment.factory] if config.environment else []))
        watching = asyncio.create_task(LoopWatch(roots).run())
        try:
            for hook in config.startup_hooks:
                await _maybe_await(hook(config.app_state))
            yield
        finally:
            watching.cancel()
            if env_sessions is not None:
                await env_sessions.close_all()
            for hook in config.shutdown_hooks:
                try:
                    await _maybe_await(hook(config.app_state))
                except Exception:  # a failing hook must not stop the others or the close
                    logger.exception("shutdown hook failed")
            await app.state.http.aclose()

    app = new_protocol_app(config, lifespan)
    app.state.config = config
    stats = app.state.stats = RolloutStats(limits.max_in_flight)
    rollouts = _Rollouts(config, trace_store=trace_store, on_session=on_session,
                         failures=failures, stats=stats)

    def denied(scope: Any) -> JSONResponse | None:
        failure = auth.check(scope["headers"])
        if failure is None:
            return None
        # Closed at once: a client without the key never holds a connection for long.
        return error_response(failure.status, failure.code, failure.message,
                              headers={"connection": "close"})

    async def root(request: Request) -> Response:
        return JSONResponse({"status": "ok", "service": config.app_id})

    async def health(request: Request) -> Response:
        return JSONResponse({
            "healthy": True, "service": config.app_id, "version": config.version,
            "auth": {"required": auth.enabled, "enabled": auth.enabled},
            "tracing": {"enabled": trace_store is not None, "destination": None,
                        "durable": False, **(trace_destination or {}),
                        "sessions": stats.traced},
            "rollouts": {"in_flight": stats.in_flight, "max_in_flight": stats.capacity,
                         "head_after_s": limits.head_after_s},
        })

    async def info(request: Request) -> Response:
        base = config.base_task_info
        return JSONResponse({
            "service": {"task": base.task.model_dump(exclude_none=True), "version": config.version,
                        "name": config.name, "description": config.description},
            "dataset": {**base.dataset.model_dump(exclude_none=True),
                        "datasets": config.dataset_registry.describe()},
            "rubrics": config.rubrics.to_info().model_dump(exclude_none=True),
            "inference": base.inference.model_dump(exclude_none=True),
            "limits": base.limits.model_dump(exclude_none=True),
        })

    async def task_info(request: Request) -> Response:
        try:
            seeds = requested_seeds(request, config.max_seeds_per_request)
            for seed in seeds:
                if (why := config.dataset_registry.unknown_seed(seed)) is not None:
                    raise BadRequest(why, status=404, code="unknown_seed", field="query.seed")
            if seeds:
                payload = await _task_instances(config, seeds)
        except BadRequest as exc:
            return bad_request_response(exc)
        except (LookupError, ValueError) as exc:
            if isinstance(exc, ValidationError):
                raise
            return error_response(404, "unknown_seed", f"no task instance for seeds {seeds}: {exc}")
        if not seeds:
            taskset = dict(config.describe_taskset()) if config.describe_taskset else {}
            return JSONResponse({
                "taskset": taskset or {"id": config.app_id, "name": config.name,
                                       "description": config.description},
                "datasets": config.dataset_registry.describe(),
                "task": config.base_task_info.task.model_dump(exclude_none=True),
                "rubric": config.rubrics.to_info().model_dump(exclude_none=True),
            })
        return JSONResponse(payload[0] if len(seeds) == 1 and len(payload) == 1 else payload)

    async def done(request: Request) -> Response:
        return JSONResponse({"ok": True, "service": config.app_id})

    async def openapi(request: Request) -> Response:
        if not openapi_schema:  # built once: the routes are fixed by now
            from synth_deploy.serving._openapi import protocol_openapi

            openapi_schema.update(protocol_openapi(config, app.routes))
        return JSONResponse(openapi_schema)

    openapi_schema: dict[str, Any] = {}
    rollout = RolloutEndpoint(config, limits=limits, stats=stats,
                              run=lambda req, body, client: rollouts.run(
                                  req, body, app.state.http, client),
                              lost=rollouts.answer_lost)
    # synth-containers' contract: its rollouts run as /rollout's, their records in the store.
    durable = AsyncRollouts(lambda req, body: rollouts.run(req, body, app.state.http),
                            stats=stats, trace=trace_store, app_id=config.app_id,
                            records=rollout_records)
    endpoints = [  # /rollout first: the hot path matches at once
        Endpoint("/rollout", "POST", rollout, "Run one episode", asgi=True,
                 ok=schema_ref("RolloutResponse"), errors=(404, 413, 415, 422, 502, 504),
                 openapi={"requestBody": {"required": True,
                                          **json_body(schema_ref("RolloutRequest"))}}),
        Endpoint("/", ("GET", "HEAD"), root, "Liveness: the app's id", public=True),
        Endpoint("/health", "GET", health, "Health, auth, tracing and rollouts in flight"),
        Endpoint("/info", "GET", info, "Service, dataset, rubrics, limits"),
        Endpoint("/task_info", "GET", task_info, "The taskset, or the task instance of each "
                 "seed", ok=task_info_schema(), errors=(404, 422),
                 openapi={"parameters": seed_parameters(config.max_seeds_per_request)}),
        Endpoint("/done", "POST", done, "The trainer is done with this app"),
        Endpoint("/openapi.json", "GET", openapi, "This document"),
        *openenv_endpoints(config, env_sessions, failures, auth),
        *containers_endpoints(config, durable, limits=limits,
                              task_instances=lambda seeds: _task_instances(config, seeds)),
    ]
    if config.proxy is not None:
        from synth_deploy.serving._proxy import proxy_endpoints

        endpoints += proxy_endpoints(app, config.proxy, env, read_body=lambda r: read_body(
            r, config.max_body_bytes), too_large=BodyTooLarge)
    # Every endpoint answers only a client with the key unless it is declared public.
    app.serve_core_routes(guarded_routes(endpoints, denied), failures)
    app.state.keyless_refusal = keyless_refusal(app, endpoints, auth)

    app.add_exception_handler(HTTPException, http_error)
    return app


class _Rollouts:
    """Runs a validated rollout request to its response: the app's rollout under its time
    bound, what the kit fills in, and the session to the live export and the store."""

    def __init__(self, config: TaskAppConfig, *, trace_store: TraceSink | None,
                 on_session: Callable[[SessionTrace], None] | None, failures: AppFailures,
                 stats: RolloutStats) -> None:
        self.config = config
        self.call_executor = _executor_caller(config.rollout)
        self.trace_store = trace_store
        self.on_session = on_session
        self.stats = stats
        self.failures = failures
        self.trace_failures = CoalescedLog(logger)  # a full disk fails every rollout

    async def run(self, req: RolloutRequest, request_json: bytes, http: Any,
                  client: InFlight | None = None) -> Response:
        """``request_json``: the body ``req`` was read from; ``client``: whether its client
        is still there (one that leaves stops the rollout, recorded as such)."""
        config, trace_store, on_session = self.config, self.trace_store, self.on_session
        inference_url = req.policy.config.get("inference_url")
        cid = correlation_id(req.policy.config)
        # Whether anyone reads the session past this answer: else its chat is not recorded.
        kept = trace_store is not None or req.record.return_trace or on_session is not None
        tracer = SessionTracer(kept=kept)
        ctx = RolloutContext(request=req, config=config, tracer=tracer, http=http,
                             app_state=config.app_state)
        bound = min(req.safety.max_time_s, config.max_rollout_seconds)
        started = time.perf_counter()
        error: JSONResponse | None = None
        result: RolloutResponse | None = None
        try:
            with deadline(bound):
                try:
                    raw = await self.call_executor(req, ctx)
                finally:  # what the rollout held (its sandboxes) ends with it
                    await ctx.close()
            elapsed = time.perf_counter() - started
            result = _completed(raw, req.run_id, tracer.finish(expand=False), wall_s=elapsed,
                                inference_url=inference_url, cid=cid)
        except asyncio.CancelledError:
            if client is None or not client.left:
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            elapsed = time.perf_counter() - started
            error = error_response(499, "client_disconnected", f"rollout {req.run_id} was "
                                   "stopped: its client disconnected before the answer",
                                   run_id=req.run_id)
        except Exception as exc:
            error = self._failure(exc, req, bound)
            elapsed = time.perf_counter() - started
        if client is not None:
            client.running = False  # from here on the rollout is finished and stored
        session = tracer.finish(expand=False)
        # Bytes straight from pydantic-core: no str round trip on the hot path.
        body = None if result is None else result.__pydantic_serializer__.to_json(result)
        facts = None
        if kept:  # building the session's metadata is wasted work when nobody reads it
            facts = _rollout_facts(req, request_json, body, error, elapsed, config.app_id, cid)
            if req.record.return_trace or on_session is not None:
                # Read here, not only where it is stored (whose writer does this off the loop)
                session.expand_exchanges()
                describe_session(session, facts)
                facts = None
            if result is not None and req.record.return_trace and result.trace is None:
                result.trace = session.to_dict()
                correlate_trace(result.trace, cid)
                body = result.__pydantic_serializer__.to_json(result)
        if on_session is not None:
            try:
                on_session(session)
            except Exception as exc:  # spans are a view of the rollout: they never fail it
                self.failures.error(exc, "live export of rollout %s failed", req.run_id,
                                    extra_secrets=_request_secrets(req))
        if trace_store is not None:
            if client is not None and body is not None:
                client.stored = session.session_id
            try:
                await trace_store.write_session(session, rollout=facts)
                self.stats.traced += 1
            except Exception as exc:
                if client is not None:
                    client.write_failed = True
                # A 200 promises a durable trace: if the write fails, the rollout fails. Why
                # is the operator's to read (where the file is, how full its disk), once.
                self.trace_failures.error(exc, "trace write failed for rollout %s", req.run_id)
                error = error_response(500, "trace_write_failed",
                                       f"rollout {req.run_id} ran but its trace could not be "
                                       f"stored ({type(exc).__name__}); see the server's log",
                                       run_id=req.run_id)
                body = None
        # What the client waits for, the commit included; an answer that is not a 200 is
        # an error, whichever step failed.
        self.stats.record(time.perf_counter() - started)
        if body is None:
            assert error is not None
            self.stats.errors += 1
            return error
        self.stats.rollouts += 1
        return _EncodedJSON(body)

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

    def _failure(self, exc: Exception, req: RolloutRequest, bound: float) -> JSONResponse:
        """A failed rollout's answer: 504 past its bound, 4xx for the client's mistake, 502
        when the policy failed, 500 for the app's own failure (secrets redacted)."""
        if isinstance(exc, TimeoutError):
            return error_response(
                504, "rollout_timeout",
                f"rollout {req.run_id} exceeded safety.max_time_s={bound:g}s and was abandoned",
                run_id=req.run_id)
        if isinstance(exc, ValidationError):
            return error_response(500, "invalid_rollout_result",
                                  f"rollout {req.run_id} returned a malformed RolloutResponse",
                                  run_id=req.run_id, errors=validation_errors(exc))
        if isinstance(exc, BadRequest):  # the client's mistake, said by the app or the kit
            exc.message = self._redacted(exc.message, req)
            return bad_request_response(exc, run_id=req.run_id)
        if isinstance(exc, PolicyError):  # the policy endpoint failed, not the app
            message = self._redacted(exc.message, req)
            self.failures.warning(exc, "rollout %s: %s", req.run_id, message,
                                  extra_secrets=_request_secrets(req))
            return error_response(502, "policy_failed", f"rollout {req.run_id}: {message}",
                                  run_id=req.run_id)
        self.failures.error(exc, "rollout %s failed", req.run_id,
                            extra_secrets=_request_secrets(req))
        message = self._redacted(f"{type(exc).__name__}: {exc}", req)
        return error_response(500, "rollout_failed", f"rollout {req.run_id} failed: {message}",
                              run_id=req.run_id, exception=type(exc).__name__)

    def _redacted(self, text: str, req: RolloutRequest) -> str:
        return self.failures.redacted(text, _request_secrets(req))


def _request_secrets(req: RolloutRequest) -> list[str]:
    # The request's own secrets, at any depth and in its URLs: a provider may echo a key in
    # its error body, an app's exception may quote the inference_url.
    return known_secrets(req.policy.config)


KeylessRefusal = Callable[[bytes, bytes, list[tuple[bytes, bytes]]], tuple[bytes, bytes] | None]


def keyless_refusal(app: Starlette, endpoints: list[Endpoint], auth: ApiKeyAuth
                    ) -> KeylessRefusal:
    """What the server's protocol answers, before any of the app runs, to a request for an
    endpoint behind the key that fails the key check (by raw method, path and headers): the
    response `denied` gives, as its head (status line on, Date to add) and its body; None
    when the app answers, as it does every request once ``app`` has middleware of the
    user's, which sees each request. A flood without a key costs a parse and a write each,
    not a request's task."""
    keyed = frozenset((method.encode(), e.path.encode()) for e in endpoints
                      if not e.public and not e.websocket for method in e.method_list)
    answers: dict[str, tuple[bytes, bytes]] = {}

    def refusal(method: bytes, path: bytes, headers: list[tuple[bytes, bytes]]
                ) -> tuple[bytes, bytes] | None:
        if (method, path) not in keyed or app.user_middleware or \
                (failure := auth.check(headers)) is None:
            return None
        answer = answers.get(failure.code)
        if answer is None:
            response = error_response(failure.status, failure.code, failure.message)
            head = "".join(f"{k.decode()}: {v.decode()}\r\n" for k, v in response.raw_headers)
            answer = answers[failure.code] = (
                f"HTTP/1.1 {failure.status} {HTTPStatus(failure.status).phrase}\r\n{head}"
                "connection: close\r\n").encode(), bytes(response.body)
        return answer
    return refusal


def _rollout_facts(req: RolloutRequest, request_json: bytes, body: bytes | None,
                   error: JSONResponse | None, elapsed: float, app_id: str,
                   cid: str | None) -> RolloutFacts:
    """What the stored session says of this rollout (see `describe_session`); ``body``: its
    answer's, None when it failed."""
    head = {"app_id": app_id, "run_id": req.run_id, "mode": req.mode, "seed": req.env.seed,
            "model": req.policy.config.get("model"), "env_name": req.env.env_name,
            **session_correlation(cid)}
    failure = None if error is None else json.loads(error.body)["detail"]["error"]
    return RolloutFacts(head, elapsed, request_json, body, failure)


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
    outcomes = session.outcome_rewards
    if outcomes and not any(metrics.get(k) not in (None, []) for k in _REWARD_KEYS):
        metrics["outcome_reward"] = outcomes[-1].total_reward
    if metrics.get("outcome_reward") is None:
        rewards = metrics.get("episode_rewards") or metrics.get("episode_returns")
        if rewards:
            metrics["outcome_reward"] = sum(rewards) / len(rewards)
    if metrics.get("outcome_score") is None and metrics.get("outcome_reward") is not None:
        metrics["outcome_score"] = metrics["outcome_reward"]
    if session.event_rewards:
        event_values = [r.reward_value for r in session.event_rewards]
        metrics.setdefault("event_rewards", event_values)
        if metrics.get("events_score") is None:
            metrics["events_score"] = sum(event_values) / len(event_values)
    if not metrics.get("num_steps"):
        metrics["num_steps"] = len(session.timesteps)
    if session.timesteps:
        # Where synth-ai's eval runner looks first for a rollout's tokens (no trace needed).
        tokens = [e.total_tokens for step in session.timesteps for e in step.events
                  if e.total_tokens is not None]
        details = metrics.get("details") or {}
        if tokens and isinstance(details, dict) and "tokens" not in details:
            metrics["details"] = {**details, "tokens": sum(tokens)}
    return metrics


def _executor_caller(executor: Any) -> Any:
    """An async callable running ``executor`` (decided once, not per request)."""
    if inspect.iscoroutinefunction(executor) or inspect.iscoroutinefunction(
            type(executor).__call__):
        return executor  # on the loop, where the loop watch sees a step that holds it

    async def in_thread(req: RolloutRequest, ctx: RolloutContext) -> Any:
        # A sync executor runs in a worker thread; on timeout the thread is abandoned, not
        # joined, so the client still gets its answer within the bound.
        result = await anyio.to_thread.run_sync(executor, req, ctx, abandon_on_cancel=True)
        return await _maybe_await(result)

    return in_thread


async def _task_instances(config: TaskAppConfig, seeds: list[int]) -> list[dict[str, Any]]:
    """``provide_task_instances(seeds)`` validated and dumped, a synchronous one on a worker
    thread: a thousand seeds must not stall every other request on the event loop."""
    provide = config.provide_task_instances

    def dumped(items: Any) -> list[dict[str, Any]]:
        return [TaskInfo.model_validate(i).model_dump(mode="json") for i in items]

    if inspect.iscoroutinefunction(provide):
        return dumped(await provide(seeds))
    return await anyio.to_thread.run_sync(lambda: dumped(provide(seeds)))


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


def stats_of(app: Any) -> Mapping[str, int]:
    """Rollout counters of a running app (for live status lines): rollout_requests,
    rollouts, errors, refused, in_flight, capacity."""
    return app.state.stats.snapshot()


__all__ = ["TraceSink", "create_app", "stats_of"]
