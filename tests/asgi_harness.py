"""A raw ASGI harness for the engine's unit layer: the app the kit builds, called as uvicorn
calls it (lifespan, HTTP, WebSocket messages), on the test's own event loop, no socket.

What a request sent is kept message by message, so a test can see a head leave before the
body (the early head) and order events with asyncio.Event instead of sleeps:

    async with Harness(app) as harness:
        answer = await harness.request("GET", "/health", key="k")
        assert answer.status == 200
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Answer:
    """What one HTTP request got: the messages the app sent, in order."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    head: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def status(self) -> int:
        return next(m["status"] for m in self.messages if m["type"] == "http.response.start")

    @property
    def headers(self) -> dict[str, str]:
        start = next(m for m in self.messages if m["type"] == "http.response.start")
        return {k.decode().lower(): v.decode() for k, v in start.get("headers", [])}

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages
                        if m["type"] == "http.response.body")

    def json(self) -> Any:
        return json.loads(self.body)


class Harness:
    """Runs ``app``'s lifespan for the ``async with`` block and sends it requests."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._lifespan_in: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._lifespan_out: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._lifespan: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Harness:
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        self._lifespan = asyncio.create_task(
            self.app(scope, self._lifespan_in.get, self._lifespan_out.put))
        await self._lifespan_in.put({"type": "lifespan.startup"})
        started = await asyncio.wait_for(self._lifespan_out.get(), 10)
        assert started["type"] == "lifespan.startup.complete", started
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._lifespan_in.put({"type": "lifespan.shutdown"})
        stopped = await asyncio.wait_for(self._lifespan_out.get(), 10)
        assert stopped["type"] == "lifespan.shutdown.complete", stopped
        assert self._lifespan is not None
        await asyncio.wait_for(self._lifespan, 10)

    def send(self, method: str, path: str, *, key: str | None = None, body: Any = None,
             headers: dict[str, str] | None = None) -> tuple[Answer, asyncio.Task[None]]:
        """Start a request; its `Answer` fills in as the app sends (``head`` and ``done``
        are set as the head and the last body part leave)."""
        raw = body if isinstance(body, bytes) else b"" if body is None else \
            json.dumps(body).encode()
        sent = {"content-type": "application/json", **(headers or {})}
        if key is not None:
            sent["x-api-key"] = key
        path, _, query = path.partition("?")
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
                 "query_string": query.encode(), "root_path": "",
                 "headers": [(k.lower().encode(), v.encode()) for k, v in sent.items()],
                 "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8001),
                 "state": {}}
        answer = Answer()
        parts = [{"type": "http.request", "body": raw, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if parts:
                return parts.pop()
            await answer.done.wait()  # then the client goes away
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            answer.messages.append(message)
            if message["type"] == "http.response.start":
                answer.head.set()
            elif not message.get("more_body", False):
                answer.done.set()

        return answer, asyncio.create_task(self.app(scope, receive, send))

    async def request(self, method: str, path: str, **options: Any) -> Answer:
        answer, task = self.send(method, path, **options)
        await asyncio.wait_for(task, 10)
        return answer

    async def websocket(self, path: str, *, key: str | None = None) -> list[dict[str, Any]]:
        """Open a WebSocket and close it: what the app sent before the client left
        (``websocket.accept``, a close, or a denial response)."""
        headers = [(b"x-api-key", key.encode())] if key is not None else []
        scope = {"type": "websocket", "asgi": {"version": "3.0"}, "scheme": "ws",
                 "path": path, "raw_path": path.encode(), "query_string": b"",
                 "root_path": "", "headers": headers, "client": ("127.0.0.1", 50001),
                 "server": ("127.0.0.1", 8001), "subprotocols": [], "state": {},
                 "extensions": {"websocket.http.response": {}}}
        incoming = [{"type": "websocket.disconnect", "code": 1000},
                    {"type": "websocket.connect"}]
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return incoming.pop() if incoming else {"type": "websocket.disconnect",
                                                    "code": 1000}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await asyncio.wait_for(self.app(scope, receive, send), 10)
        return sent
