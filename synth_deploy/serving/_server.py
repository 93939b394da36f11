"""`create_app(config)`: a task app's HTTP server, assembled: its lifespan, the key gate, the
rollout run, and the routes of each protocol it speaks (synth-ai's `/rollout` and core routes,
synth-containers' `/containers`, OpenEnv's `/openenv`).

Handlers take the raw `Request` and answer `Response` objects: the hot path (`/rollout`)
validates with pydantic-core straight from bytes and skips FastAPI's dependency machinery,
which is where most of synth-ai's per-request overhead goes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol

from starlette.applications import Starlette
from starlette.exceptions import HTTPException

from synth_deploy.env import Env
from synth_deploy.serving._admission import RolloutLimits, RolloutStats
from synth_deploy.serving._auth import ApiKeyAuth
from synth_deploy.serving._blocking import LoopWatch, app_code
from synth_deploy.serving._core_routes import CoreRoutes, task_instances
from synth_deploy.serving._failures import AppFailures
from synth_deploy.serving._key_gate import KeyGate
from synth_deploy.serving._openapi import json_body, schema_ref
from synth_deploy.serving._protocol_app import new_protocol_app
from synth_deploy.serving._proxy import VENDOR_KEYS
from synth_deploy.serving._request_guards import BodyTooLarge, http_error, read_body
from synth_deploy.serving._rollout_endpoint import RolloutEndpoint
from synth_deploy.serving._rollout_run import RolloutRun, maybe_await
from synth_deploy.serving._routes import Endpoint, declared_routes, public_routes
from synth_deploy.serving._trace_context import TraceContextScope
from synth_deploy.serving.containers._durable import AsyncRollouts
from synth_deploy.serving.containers._wire import ContainersWire
from synth_deploy.serving.openenv._wire import KEYED_PREFIX, openenv_endpoints, openenv_sessions
from synth_deploy.taskapp._outbound import open_outbound
from synth_deploy.taskapp.config import TaskAppConfig
from synth_deploy.tracing import RolloutFacts, RolloutRecords, SessionTrace

logger = logging.getLogger("synth_deploy.taskapp")


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
                await maybe_await(hook(config.app_state))
            yield
        finally:
            watching.cancel()
            if env_sessions is not None:
                await env_sessions.close_all()
            for hook in config.shutdown_hooks:
                try:
                    await maybe_await(hook(config.app_state))
                except Exception:  # a failing hook must not stop the others or the close
                    logger.exception("shutdown hook failed")
            await app.state.http.aclose()

    app = new_protocol_app(config, lifespan)
    app.state.config = config
    stats = app.state.stats = RolloutStats(limits.max_in_flight)
    # One run for every protocol's rollouts: each turns its outcome into its own answer.
    rollouts = RolloutRun(config, http=lambda: app.state.http, trace_store=trace_store,
                          on_session=on_session, failures=failures, stats=stats)
    durable = AsyncRollouts(rollouts.run, stats=stats, records=rollout_records,
                            app_id=config.app_id)
    core = CoreRoutes(config, auth=auth, stats=stats, limits=limits,
                      traced=trace_store is not None, trace_destination=trace_destination,
                      routes=app.routes)
    endpoints = [  # /rollout first: the hot path matches at once
        # A request's W3C traceparent is the parent of its rollout's spans and policy calls.
        Endpoint("/rollout", "POST", TraceContextScope(
            RolloutEndpoint(config, rollouts=rollouts, limits=limits, stats=stats)),
                 "Run one episode", asgi=True, ok=schema_ref("RolloutResponse"),
                 errors=(404, 413, 415, 422, 502, 504),
                 openapi={"requestBody": {"required": True,
                                          **json_body(schema_ref("RolloutRequest"))}}),
        *core.endpoints(),
        *openenv_endpoints(config, env_sessions, failures, auth),
        *ContainersWire(config, durable, limits=limits, task_instances=lambda seeds, field:
                        task_instances(config, seeds, field=field)).endpoints(),
    ]
    if config.proxy is not None:
        from synth_deploy.serving._proxy import proxy_endpoints

        endpoints += proxy_endpoints(app, config.proxy, env, read_body=lambda r: read_body(
            r, config.max_body_bytes), too_large=BodyTooLarge)
    # Every path answers only a client with the key unless an endpoint declares it public.
    gate = KeyGate(auth, public_routes(endpoints), unkeyed_prefix=KEYED_PREFIX)
    app.serve_core_routes(declared_routes(endpoints), failures, gate)
    app.state.keyless_refusal = gate.raw_refusal
    app.add_exception_handler(HTTPException, http_error)
    return app


def stats_of(app: Any) -> Mapping[str, int]:
    """Rollout counters of a running app (for live status lines): rollout_requests,
    rollouts, errors, refused, in_flight, capacity."""
    return app.state.stats.snapshot()


__all__ = ["TraceSink", "create_app", "stats_of"]
