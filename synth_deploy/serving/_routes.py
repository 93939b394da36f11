"""Routes declared with their access: an endpoint answers only a client with the key unless
it is declared public, and the OpenAPI document is written from the same declarations.

    endpoints = [Endpoint("/health", "GET", health, "Health", ok=OBJECT),
                 Endpoint("/", "GET", root, "Liveness", ok=OBJECT, public=True)]
    app.router.routes += guarded_routes(endpoints, denied)

``denied(scope)`` is the key check (a response refusing the request, or None). A handler
takes a `Request` and returns a `Response`; with ``asgi=True`` it is an ASGI app (the hot
path, ``/rollout``) and is guarded the same way, before it sees anything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

Denied = Callable[[Any], Response | None]  # an ASGI scope -> a refusal, or None
_POLICY_VIOLATION = 1008  # a WebSocket close code: the server refused the client
OBJECT: Mapping[str, Any] = MappingProxyType({"type": "object"})  # any JSON object


@dataclass(frozen=True)
class Endpoint:
    """One protocol endpoint: where, what runs, who may call it, and what it answers.

    ``ok``: the JSON schema of a 200's body; ``errors``: the statuses it may answer besides
    the key's (401, 403, 503 unless ``public``); ``openapi``: more of its OpenAPI operation
    (``parameters``, ``requestBody``).
    """

    path: str
    methods: tuple[str, ...] | str
    handler: Any
    summary: str
    ok: Mapping[str, Any] = field(default_factory=lambda: OBJECT)
    errors: tuple[int, ...] = ()
    public: bool = False
    asgi: bool = False
    websocket: bool = False  # ``handler`` takes a `WebSocket`; refused at the handshake
    openapi: Mapping[str, Any] = field(default_factory=dict)

    @property
    def method_list(self) -> list[str]:
        return [self.methods] if isinstance(self.methods, str) else list(self.methods)


class DeclaredRoute(Route):
    """A Starlette route that keeps its declaration (what the auth test and the OpenAPI
    document read)."""

    def __init__(self, endpoint: Endpoint, app: Any) -> None:
        super().__init__(endpoint.path, app, methods=endpoint.method_list)
        self.declaration = endpoint


class DeclaredWebSocketRoute(WebSocketRoute):
    """A WebSocket route that keeps its declaration."""

    def __init__(self, endpoint: Endpoint, app: Any) -> None:
        super().__init__(endpoint.path, app)
        self.declaration = endpoint


def guarded_routes(endpoints: list[Endpoint], denied: Denied
                   ) -> list[DeclaredRoute | DeclaredWebSocketRoute]:
    """The routes of ``endpoints``, each behind ``denied`` unless declared public."""
    return [(DeclaredWebSocketRoute if e.websocket else DeclaredRoute)(e, _guarded(e, denied))
            for e in endpoints]


def _guarded(endpoint: Endpoint, denied: Denied) -> Any:
    handler = endpoint.handler
    if endpoint.public:
        return handler
    if endpoint.asgi:
        return _GuardedApp(handler, denied)
    if endpoint.websocket:
        async def guarded_socket(websocket: WebSocket) -> None:
            if (refusal := denied(websocket.scope)) is not None:
                # Refused at the handshake: the handler never runs, nothing is held.
                if "websocket.http.response" in websocket.scope.get("extensions", {}):
                    await websocket.send_denial_response(refusal)
                else:
                    await websocket.close(_POLICY_VIOLATION)
                return
            await handler(websocket)
        return guarded_socket

    async def guarded(request: Request) -> Response:
        refusal = denied(request.scope)
        return refusal if refusal is not None else await handler(request)
    guarded.__name__ = getattr(handler, "__name__", "endpoint")
    return guarded


class _GuardedApp:
    """An ASGI endpoint behind the key check (an object: Starlette would take a function
    for a request handler)."""

    __slots__ = ("app", "denied")

    def __init__(self, app: Any, denied: Denied) -> None:
        self.app, self.denied = app, denied

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if (refusal := self.denied(scope)) is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)


__all__ = ["DeclaredRoute", "DeclaredWebSocketRoute", "Denied", "Endpoint", "OBJECT",
           "guarded_routes"]
