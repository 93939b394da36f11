"""The key gate: a served app answers a client without its key on its public routes only.

One check, at the app's entry, before routing and before any middleware of the user's: a
keyless request for any other path, whatever its method and whether a route has it, is
answered 401 (403 for a wrong key) and never learns which routes exist. The app is guarded
the same way wherever it runs: served by `synth-deploy serve` or as the bare ASGI app Modal
serves. Served by the kit's own protocol (`_connections`), the same answer is given before
the app is called at all (`raw_refusal`), so a keyless flood costs a parse and a write each
and is paced by address.
"""

from __future__ import annotations

from collections.abc import Iterable
from http import HTTPStatus
from typing import Any

from starlette.responses import JSONResponse
from starlette.websockets import WebSocket

from synth_deploy.serving._auth import ApiKeyAuth
from synth_deploy.serving._responses import error_response

_POLICY_VIOLATION = 1008  # a WebSocket close code: the server refused the client


class KeyGate:
    """``auth``: the app's keys (`ApiKeyAuth`); ``public``: the (method, path) pairs a client
    without a key may call; ``unkeyed_prefix``: paths that carry their key in the path itself,
    which the app moves into a header before the gate reads it (OpenEnv's keyed base URL)."""

    def __init__(self, auth: ApiKeyAuth, public: Iterable[tuple[str, str]], *,
                 unkeyed_prefix: str | None = None) -> None:
        self.auth = auth
        self.public = frozenset(public)
        self._raw_public = frozenset((m.encode(), p.encode()) for m, p in self.public)
        self._unkeyed_prefix = None if unkeyed_prefix is None else unkeyed_prefix.encode()
        self._answers: dict[str, tuple[bytes, bytes]] = {}

    def refusal(self, scope: Any) -> JSONResponse | None:
        """The answer refusing ``scope`` (an HTTP or WebSocket request), or None to let it
        through."""
        if (scope.get("method", "GET"), scope["path"]) in self.public:
            return None
        failure = self.auth.check(scope["headers"])
        if failure is None:
            return None
        # Closed at once: a client without the key never holds a connection for long.
        return error_response(failure.status, failure.code, failure.message,
                              headers={"connection": "close"})

    async def refuse(self, refusal: JSONResponse, scope: Any, receive: Any, send: Any) -> None:
        """Answer ``scope`` with its `refusal`: an HTTP response, or a WebSocket refused at
        its handshake."""
        if scope["type"] == "websocket":
            # Refused at the handshake: no handler runs, nothing is held.
            websocket = WebSocket(scope, receive, send)
            if "websocket.http.response" in scope.get("extensions", {}):
                await websocket.send_denial_response(refusal)
            else:
                await websocket.close(_POLICY_VIOLATION)
        else:
            await refusal(scope, receive, send)

    def raw_refusal(self, method: bytes, path: bytes, headers: list[tuple[bytes, bytes]]
                    ) -> tuple[bytes, bytes] | None:
        """What the server's protocol answers, before any of the app runs, to a request that
        fails the check (by raw method, path and headers): its head (status line on, Date to
        add) and body; None when the app is to answer."""
        if (method, path) in self._raw_public or (
                self._unkeyed_prefix is not None and path.startswith(self._unkeyed_prefix)):
            return None
        failure = self.auth.check(headers)
        if failure is None:
            return None
        answer = self._answers.get(failure.code)
        if answer is None:
            response = error_response(failure.status, failure.code, failure.message)
            head = "".join(f"{k.decode()}: {v.decode()}\r\n" for k, v in response.raw_headers)
            answer = self._answers[failure.code] = (
                f"HTTP/1.1 {failure.status} {HTTPStatus(failure.status).phrase}\r\n{head}"
                "connection: close\r\n").encode(), bytes(response.body)
        return answer


__all__ = ["KeyGate"]
