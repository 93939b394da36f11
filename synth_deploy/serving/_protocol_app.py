"""The ASGI app a task app is served as: Starlette, or FastAPI when the app brings routers.

The protocol's own endpoints (``/rollout``, ``/health``, ``/task_info``...) take a `Request`
and return a `Response`, so neither FastAPI's dependency machinery nor its middleware has
anything to do for them. FastAPI is imported only for an app with its own FastAPI routers:
it is a fifth of a second of start-up, paid on every cold start of a deployed container.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.routing import BaseRoute, Router

from synth_deploy.serving._failures import AppFailures
from synth_deploy.serving._key_gate import KeyGate
from synth_deploy.serving._request_guards import guarded
from synth_deploy.serving.openenv._wire import KEYED_PREFIX, unkey
from synth_deploy.taskapp.config import TaskAppConfig


class LeanProtocolPaths:
    """Serves the protocol's endpoints on a lean path (mixed into the app's class).

    While no user middleware is installed, a request for a protocol endpoint goes straight
    to a plain router behind the same 405 and 500 handlers, and ``POST /rollout``, the hot
    path, straight to its handler; everything else, and every request once middleware is
    added, takes the app's full path.
    """

    root_path = ""  # FastAPI's setting; a mounted app cannot skip the full path
    _core_paths: frozenset[str] = frozenset()
    _core_app: Any = None
    _rollout_app: Any = None
    _failures: AppFailures | None = None
    _gate: KeyGate | None = None

    def serve_core_routes(self, routes: list[BaseRoute], failures: AppFailures,
                          gate: KeyGate) -> None:
        """Serve ``routes`` on the lean path, every request behind ``gate``; what escapes
        any route is logged by ``failures``."""
        self._failures, self._gate = failures, gate
        self.router.routes.extend(routes)  # type: ignore[attr-defined]
        self._core_paths = frozenset(route.path for route in routes)  # type: ignore[attr-defined]
        self._core_app = guarded(Router(routes=routes))
        # The rollout endpoint (an ASGI app) answers every failure of a rollout itself: no
        # route matching, no exception middleware.
        self._rollout_app = next(
            r.endpoint for r in routes if r.path == "/rollout")  # type: ignore[attr-defined]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            if scope["path"].startswith(KEYED_PREFIX):
                unkey(scope)  # OpenEnv's base URL with the key in it: gone before any log
            # Before routing and any middleware: wherever the app is served. A request that
            # passes costs a check, not a coroutine.
            if self._gate is not None and (refusal := self._gate.refusal(scope)) is not None:
                await self._gate.refuse(refusal, scope, receive, send)
                return
        try:
            await self._route(scope)(scope, receive, send)
        except Exception as exc:
            # Answered already (a 500, or a cut response); raised on, the server would log
            # its raw traceback once per request, secrets and all.
            if self._failures is None or scope["type"] not in ("http", "websocket"):
                raise
            self._failures.error(exc, "%s %s failed", scope.get("method", "WEBSOCKET"),
                                 scope["path"])

    def _route(self, scope: Any) -> Any:
        """Where ``scope`` goes: the lean path for a protocol endpoint while the app has no
        middleware of the user's, else the app's full path."""
        if scope["type"] != "http" or scope["path"] not in self._core_paths \
                or self.user_middleware or self.root_path:  # type: ignore[attr-defined]
            return super().__call__  # type: ignore[misc]
        scope["app"] = self
        if scope["path"] == "/rollout" and scope["method"] == "POST":
            return self._rollout_app
        return self._core_app


class ProtocolApp(LeanProtocolPaths, Starlette):
    """A task app served without FastAPI."""


def new_protocol_app(config: TaskAppConfig, lifespan: Callable[[Any], Any]) -> Starlette:
    """The app for ``config``, its routes still to add: FastAPI when it has routers."""
    if not config.routers:
        return ProtocolApp(lifespan=lifespan)
    app = _protocol_fastapi()(title=config.name, description=config.description,
                              version=config.version, lifespan=lifespan, docs_url=None,
                              redoc_url=None, openapi_url=None)
    for router in config.routers:
        app.include_router(router)
    return app


@functools.cache
def _protocol_fastapi() -> type:
    """FastAPI with the protocol's endpoints on the lean path: imported only for an app with
    its own routers."""
    from fastapi import FastAPI

    class ProtocolFastAPI(LeanProtocolPaths, FastAPI):
        """FastAPI, the protocol's endpoints on the lean path."""

    return ProtocolFastAPI


__all__ = ["ProtocolApp", "new_protocol_app"]
