"""The proxies a trainer's long rollout passes through in production, with their limits
settable so that a test of minutes takes seconds (loopback only, real HTTP both ways). Their
defaults are the facts the kit quotes (`synth_deploy.proxy_limits`): this module is the one
place the tests model those proxies.

`EdgeProxy` stands in for Cloudflare's edge in front of a tunnel: it forwards each request
to the origin and streams the answer back, but when the origin sends no byte for
``silence_s`` (Cloudflare: 125 s) it gives up — before the head, the client gets Cloudflare's
``524 A timeout occurred``; once the answer has begun, the connection is cut. `QuickTunnel`
is the same edge in front of a quick tunnel: past ``max_in_flight`` (200) requests at once it
answers 429, and a ``text/event-stream`` answer reaches the client only once it is complete.

`ModalFrontEnd` stands in for Modal's web endpoint front end: a request the function has not
begun to answer within ``redirect_after_s`` (Modal: 150 s) is answered ``303 See Other`` to
its result URL (the same URL with ``__modal_function_call_id``) while the function goes on;
a GET of the result URL waits up to ``redirect_after_s`` again, then answers the function's
response or another 303. An answer that has begun (its head sent) is streamed through.

`StrictModalFrontEnd` is Modal's front end under the strict reading of its docs: every body
that is not ``text/event-stream`` is buffered until it is complete, and a call not complete
within ``redirect_after_s`` is a 303 to its result URL whatever the function has sent (an
early head and heartbeats do not help); an event stream is relayed as it is written.

    with EdgeProxy(origin_url, silence_s=2) as edge:
        httpx.post(edge.url + "/rollout", ...)
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from synth_deploy.proxy_limits import (
    CLOUDFLARE_READ_TIMEOUT_S,
    MODAL_WEB_REDIRECT_S,
    QUICK_TUNNEL_INFLIGHT_LIMIT,
)
from synth_deploy.serving import BackgroundServer

_HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length",
               b"host", b"te", b"trailer", b"upgrade"}
FUNCTION_CALL_PARAM = "__modal_function_call_id"


def _forwarded_headers(raw: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in raw if k.lower() not in _HOP_BY_HOP]


def _relayed(upstream: httpx.Response, chunks: Any) -> StreamingResponse:
    """The origin's answer streamed back as it comes (its hop-by-hop headers dropped)."""
    headers = {k.decode("latin-1"): v.decode("latin-1")
               for k, v in _forwarded_headers([(k.lower(), v) for k, v in upstream.headers.raw])}
    return StreamingResponse(chunks, status_code=upstream.status_code, headers=headers)


class _Proxy:
    """An ASGI proxy served on a thread; subclasses decide what a slow origin gets."""

    def __init__(self, origin_url: str) -> None:
        self.origin_url = origin_url.rstrip("/")
        self.answered: list[int] = []  # the statuses this proxy gave its clients
        async def app(scope: Any, receive: Any, send: Any) -> None:
            await self._asgi(scope, receive, send)

        self._server = BackgroundServer(app)
        self._client: httpx.AsyncClient | None = None

    @property
    def url(self) -> str:
        return self._server.url

    def __enter__(self) -> _Proxy:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()

    async def _asgi(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        request = Request(scope, receive)
        response = await self.handle(request)
        self.answered.append(response.status_code)
        await response(scope, receive, send)

    async def origin_request(self, request: Request) -> httpx.Request:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=None)
        body = await request.body()
        url = self.origin_url + request.url.path
        query = "&".join(p for p in request.url.query.split("&")
                         if p and not p.startswith(FUNCTION_CALL_PARAM))
        return self._client.build_request(
            request.method, url + (f"?{query}" if query else ""),
            headers=_forwarded_headers(request.scope["headers"]), content=body)

    async def handle(self, request: Request) -> Response:
        raise NotImplementedError


class EdgeProxy(_Proxy):
    """Cloudflare's rule: no byte from the origin for ``silence_s`` ends the request."""

    def __init__(self, origin_url: str, *,
                 silence_s: float = CLOUDFLARE_READ_TIMEOUT_S) -> None:
        super().__init__(origin_url)
        self.silence_s = silence_s
        self.cut = 0  # answers cut after their head

    async def handle(self, request: Request) -> Response:
        upstream_request = await self.origin_request(request)
        try:
            upstream = await asyncio.wait_for(
                self._client.send(upstream_request, stream=True), self.silence_s)
        except TimeoutError:
            return Response("error code: 524", status_code=524,
                            media_type="text/plain")  # what Cloudflare's edge sends
        chunks = upstream.aiter_raw()
        silence_s = self.silence_s

        async def relay() -> Any:
            try:
                while True:
                    try:
                        chunk = await asyncio.wait_for(chunks.__anext__(), silence_s)
                    except StopAsyncIteration:
                        return
                    except TimeoutError:
                        self.cut += 1
                        raise ConnectionAbortedError("origin silent: the edge cut it") from None
                    yield chunk
            finally:
                await upstream.aclose()

        return _relayed(upstream, relay())


class QuickTunnel(EdgeProxy):
    """A quick tunnel's edge: `EdgeProxy`'s silence rule, 429 past ``max_in_flight``
    requests at once, and no server-sent events (a stream arrives whole, when it ends)."""

    def __init__(self, origin_url: str, *, silence_s: float = CLOUDFLARE_READ_TIMEOUT_S,
                 max_in_flight: int = QUICK_TUNNEL_INFLIGHT_LIMIT) -> None:
        super().__init__(origin_url, silence_s=silence_s)
        self.max_in_flight = max_in_flight
        self.in_flight = 0
        self.too_many = 0  # answered 429

    async def handle(self, request: Request) -> Response:
        if self.in_flight >= self.max_in_flight:
            self.too_many += 1
            return Response("error code: 1015", status_code=429, media_type="text/plain")
        self.in_flight += 1
        try:
            response = await super().handle(request)
            if response.media_type != "text/event-stream" and not response.headers.get(
                    "content-type", "").startswith("text/event-stream"):
                return response
            # Held to its end: the client hears nothing meanwhile, and the edge's silence
            # rule applies to what the client hears.
            # The limit is checked as each chunk comes (the origin's heartbeats come often),
            # not by cancelling the read: a cancellation the relay swallows would let the
            # whole stream through.
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.silence_s
            parts: list[bytes] = []
            cut = Response("error code: 524", status_code=524, media_type="text/plain")
            try:
                async for c in response.body_iterator:
                    if loop.time() > deadline:
                        await response.body_iterator.aclose()
                        return cut
                    parts.append(c if isinstance(c, bytes) else c.encode())
            except ConnectionAbortedError:  # the origin fell silent: the edge cut it
                return cut
            if loop.time() > deadline:
                return cut
            body = b"".join(parts)
            return Response(body, status_code=response.status_code,
                            headers=dict(response.headers))
        finally:
            self.in_flight -= 1


class ModalFrontEnd(_Proxy):
    """Modal's rule: a request not begun within ``redirect_after_s`` becomes a 303 to its
    result URL; the function runs on."""

    def __init__(self, origin_url: str, *,
                 redirect_after_s: float = MODAL_WEB_REDIRECT_S) -> None:
        super().__init__(origin_url)
        self.redirect_after_s = redirect_after_s
        self.redirects = 0
        self._calls: dict[str, asyncio.Task[httpx.Response]] = {}
        self._ids = itertools.count(1)

    async def handle(self, request: Request) -> Response:
        call_id = request.query_params.get(FUNCTION_CALL_PARAM)
        if call_id is not None:
            call = self._calls.get(call_id)
            if call is None:
                return JSONResponse({"error": "unknown function call"}, status_code=404)
        else:
            upstream_request = await self.origin_request(request)
            call = asyncio.get_running_loop().create_task(
                self._client.send(upstream_request, stream=True))
            call_id = f"fc-{next(self._ids):08d}"
            self._calls[call_id] = call
        try:
            upstream = await asyncio.wait_for(asyncio.shield(call), self.redirect_after_s)
        except TimeoutError:
            self.redirects += 1
            path = request.url.path
            return Response(status_code=303, headers={
                "location": f"{path}?{FUNCTION_CALL_PARAM}={call_id}"})
        self._calls.pop(call_id, None)

        async def relay() -> Any:
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await upstream.aclose()

        return _relayed(upstream, relay())


class StrictModalFrontEnd(ModalFrontEnd):
    """Modal's rule, strictly read: a call whose body is not complete within
    ``redirect_after_s`` is a 303 to its result URL, whatever it has sent; only an event
    stream is relayed as it is written."""

    async def handle(self, request: Request) -> Response:
        call_id = request.query_params.get(FUNCTION_CALL_PARAM)
        if call_id is not None:
            call = self._calls.get(call_id)
            if call is None:
                return JSONResponse({"error": "unknown function call"}, status_code=404)
        else:
            upstream_request = await self.origin_request(request)
            call = asyncio.get_running_loop().create_task(self._complete(upstream_request))
            call_id = f"fc-{next(self._ids):08d}"
            self._calls[call_id] = call
        try:
            upstream, body = await asyncio.wait_for(asyncio.shield(call), self.redirect_after_s)
        except TimeoutError:
            self.redirects += 1
            return Response(status_code=303, headers={
                "location": f"{request.url.path}?{FUNCTION_CALL_PARAM}={call_id}"})
        self._calls.pop(call_id, None)
        if body is None:  # an event stream: relayed as it comes
            async def relay() -> Any:
                try:
                    async for chunk in upstream.aiter_raw():
                        yield chunk
                finally:
                    await upstream.aclose()
            return _relayed(upstream, relay())
        return _relayed(upstream, iter([body]))

    async def _complete(self, upstream_request: httpx.Request
                        ) -> tuple[httpx.Response, bytes | None]:
        """The origin's answer, its body read to the end (None: an event stream)."""
        upstream = await self._client.send(upstream_request, stream=True)
        if upstream.headers.get("content-type", "").startswith("text/event-stream"):
            return upstream, None
        try:
            return upstream, await upstream.aread()
        finally:
            await upstream.aclose()


__all__ = ["EdgeProxy", "FUNCTION_CALL_PARAM", "ModalFrontEnd", "QuickTunnel",
           "StrictModalFrontEnd"]
