"""Routes declared with their access: an endpoint answers only a client with the key unless
it is declared public (the key gate reads the declarations: `_key_gate`), and the OpenAPI
document is written from the same declarations.

    endpoints = [Endpoint("/health", "GET", health, "Health", ok=OBJECT),
                 Endpoint("/", "GET", root, "Liveness", ok=OBJECT, public=True)]
    app.router.routes += declared_routes(endpoints)

A handler takes a `Request` and returns a `Response`; with ``asgi=True`` it is an ASGI app
(the hot path, ``/rollout``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from starlette.routing import Route, WebSocketRoute

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


class AsgiEndpoint:
    """A bound method taking (scope, receive, send) as an ASGI endpoint: Starlette takes any
    function or method for a request handler, an object for an ASGI app."""

    __slots__ = ("call",)

    def __init__(self, call: Callable[[Any, Any, Any], Any]) -> None:
        self.call = call

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.call(scope, receive, send)


def declared_routes(endpoints: list[Endpoint]) -> list[DeclaredRoute | DeclaredWebSocketRoute]:
    """The routes of ``endpoints``, each keeping its declaration. Who may call them is the
    key gate's to say (`_key_gate`), at the app's entry, from the same declarations."""
    return [(DeclaredWebSocketRoute if e.websocket else DeclaredRoute)(e, e.handler)
            for e in endpoints]


def public_routes(endpoints: list[Endpoint]) -> list[tuple[str, str]]:
    """The (method, path) pairs of ``endpoints`` declared public."""
    return [(method, e.path) for e in endpoints if e.public for method in e.method_list]


__all__ = ["AsgiEndpoint", "DeclaredRoute", "DeclaredWebSocketRoute", "Endpoint", "OBJECT",
           "declared_routes", "public_routes"]
