"""OpenEnv's client side, small and faithful, for tests that must not need openenv itself.

Written from openenv-core's ``EnvClient`` (0.3) and ``openenv`` 0.10 (``env_client.py``): a
WebSocket to ``{base}/ws`` (extra headers sent with the handshake, as 0.10's ``headers=``),
one JSON message per call, ``{"type": "reset", "data": {...}}`` / ``{"type": "step", "data":
action}`` / ``{"type": "state"}`` / ``{"type": "close"}``, and an ``{"type": "error"}``
answer raised as `ServerError` (the real client raises RuntimeError naming the code). The
HTTP side is openenv-core 0.1's ``HTTPEnvClient``: a cookie-keeping session posting
``/reset`` and ``/step`` (``{"action": ..., "timeout_s": ...}``) and getting ``/state``.
bench/openenv_wire.py drives the same server with OpenEnv's own client and validator.
"""

from __future__ import annotations

import json
import socket
from urllib.parse import urlsplit

import httpx
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    CloseConnection,
    Message,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError


class ServerError(RuntimeError):
    def __init__(self, data: dict) -> None:
        super().__init__(f"Server error: {data.get('message')} (code: {data.get('code')})")
        self.code, self.data = data.get("code"), data


class Rejected(ConnectionError):
    """The handshake was refused with an HTTP answer."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"WebSocket handshake refused: HTTP {status}")
        self.status, self.body = status, body


class WSEnvClient:
    """One OpenEnv session over a WebSocket (synchronous; every read bounded by ``timeout``)."""

    def __init__(self, base_url: str, *, headers: dict[str, str] | None = None,
                 timeout: float = 30.0) -> None:
        parts = urlsplit(base_url)
        self.host, self.port = parts.hostname, parts.port or 80
        self.path = parts.path.rstrip("/") + "/ws"
        self.headers = headers or {}
        self.timeout = timeout
        self.sock: socket.socket | None = None
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.closed_by_server: CloseConnection | None = None
        self._pending: list[str] = []
        self._backlog: list = []

    def connect(self) -> WSEnvClient:
        self.sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        self.sock.sendall(self.ws.send(Request(
            host=f"{self.host}:{self.port}", target=self.path,
            extra_headers=[(k.encode(), v.encode()) for k, v in self.headers.items()])))
        status, body = None, b""
        while True:
            events = self._events()
            for index, event in enumerate(events):
                if isinstance(event, AcceptConnection):
                    # Frames may come with the handshake's answer: keep what came after it
                    # (wsproto makes the connection only as it yields this event).
                    self.ws.connection = self.ws.handshake.connection
                    self._backlog = events[index + 1:] + list(self.ws.connection.events())
                    return self
                if isinstance(event, RejectConnection):
                    status = event.status_code
                    if not event.has_body:
                        raise Rejected(status, b"")
                elif isinstance(event, RejectData):
                    body += event.data
                    if event.body_finished:
                        raise Rejected(status or 0, body)

    def _events(self) -> list:
        """The events an earlier read brought, else those of one more read."""
        events, self._backlog = self._backlog + list(self.ws.events()), []
        if events:
            return events
        data = self.sock.recv(65536)
        self.ws.receive_data(data or None)
        events = list(self.ws.events())
        if not data and not any(isinstance(e, CloseConnection) for e in events):
            raise ConnectionError("the server closed the connection")
        return events

    def send(self, message: dict) -> None:
        self.sock.sendall(self.ws.send(Message(data=json.dumps(message))))

    def receive(self) -> dict:
        text: list[str] = []
        while True:
            if self._pending:
                return json.loads(self._pending.pop(0))
            for event in self._events():
                if isinstance(event, TextMessage):
                    text.append(event.data)
                    if event.message_finished:
                        self._pending.append("".join(text))
                        text = []
                elif isinstance(event, CloseConnection):
                    self.closed_by_server = event
                    if not self._pending:
                        raise ConnectionError(f"closed by the server: {event.code} "
                                              f"{event.reason}")

    def call(self, message: dict) -> dict:
        self.send(message)
        answer = self.receive()
        if answer.get("type") == "error":
            raise ServerError(answer.get("data", {}))
        return answer

    def reset(self, **kwargs) -> dict:
        return self.call({"type": "reset", "data": kwargs})["data"]

    def step(self, action: dict) -> dict:
        return self.call({"type": "step", "data": action})["data"]

    def state(self) -> dict:
        return self.call({"type": "state"})["data"]

    def close(self) -> None:
        """As EnvClient.disconnect: a close message, then the close handshake."""
        if self.sock is None:
            return
        try:
            self.send({"type": "close"})
            self.sock.sendall(self.ws.send(CloseConnection(code=1000)))
        except (OSError, LocalProtocolError):
            pass  # closed by the server already
        self.vanish()

    def vanish(self) -> None:
        """Drop the connection without a word, as a killed client does."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def __enter__(self) -> WSEnvClient:
        return self.connect()

    def __exit__(self, *exc) -> None:
        self.close()


class HTTPEnvClient:
    """openenv-core 0.1's HTTP client: one cookie-keeping session of POST /reset, /step."""

    def __init__(self, base_url: str, *, headers: dict[str, str] | None = None,
                 timeout: float = 30.0) -> None:
        self.http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers or {},
                                 timeout=timeout)

    def reset(self, **kwargs) -> dict:
        return self._ok(self.http.post("/reset", json=kwargs))

    def step(self, action: dict) -> dict:
        return self._ok(self.http.post("/step", json={"action": action, "timeout_s": 15}))

    def state(self) -> dict:
        return self._ok(self.http.get("/state"))

    @staticmethod
    def _ok(resp: httpx.Response) -> dict:
        resp.raise_for_status()
        return resp.json()

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> HTTPEnvClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
