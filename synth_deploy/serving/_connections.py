"""uvicorn's HTTP/1.1 protocols, with the bounds they lack and a response sent in one piece.

The protocol is uvicorn's fast one (httptools) when it is installed, else its h11 one; both get
the same bounds from `_Bounded`:

- a request's headers must arrive within ``header_timeout_s`` of the connection opening (or of
  the previous response), and its body within ``body_timeout_s`` of the headers, or the
  connection is closed. uvicorn starts its keep-alive timer only after a first response and
  any byte resets it, so without this a client that sends a header byte every few seconds
  holds a connection, and a file descriptor, forever;
- what the protocols log about a client is kept short and rare (`_client_log`): no query
  strings, no WebSocket handshakes without the access log, one malformed-request warning
  every few seconds;
- beyond ``max_connections`` open connections a new one is answered 503 at once and closed,
  so a crowd gets a prompt "come back later" instead of a hang. The cap guards file
  descriptors, not capacity: how many rollouts run at once is the app's admission limit
  (`_admission`), and a client whose request fails authentication is closed at once;
- on the fast path a request that fails the key check is answered by the protocol, before
  the app, and past a budget of failures a second its address's refusals wait
  (`FailedAuth`): a keyless flood is paced by the server instead of taking its core.

Deadlines are checked by one sweep per server (`_Sweep`), which reads where each connection
is from uvicorn's own request cycle (``cycle.response_complete``, ``cycle.more_body``): a
request costs nothing extra. tests/serving/test_connection_limits.py pins those attributes.

Settings come from `ConnectionLimits` (see `_runner`, the one place uvicorn is configured).
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

try:  # the fast path: uvicorn's C parser (the `httptools` wheel)
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - where the wheel does not install
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

from synth_deploy.serving._admission import ConnectionLimits
from synth_deploy.serving._client_log import ClientLog

logger = logging.getLogger("synth_deploy.taskapp")
_REFUSED_LINGER_S = 1.0  # a refused client still gets to read its 503 before the close
_WARN_EVERY_S = 10.0  # a flood of refusals is one log line every so often, not one each
_last_warning = [float("-inf")]


def _busy_response(limit: int) -> bytes:
    body = json.dumps({"detail": {"error": {
        "code": "server_busy",
        "message": f"the server already holds its maximum of {limit} connections; retry "
                   f"shortly"}}}).encode()
    head = ("HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nretry-after: 1\r\nconnection: close\r\n\r\n")
    return head.encode() + body


class _Bounded:
    """Request deadlines and a connection cap over a uvicorn HTTP protocol (mixed in first)."""

    _limits: ConnectionLimits
    _refused = False
    _answered = False  # a refusal without the key: its answer has been written
    _request_read = False  # ... and the refused request has been read to its end
    # What the client owes next, as the sweep last saw it: the request cycle it was seen
    # on, "headers" or "body" (None while a request runs), and since when.
    _seen_cycle: Any = None
    _waiting_for: str | None = "headers"
    _waiting_since = 0.0

    def __init__(self, config: Any, server_state: Any, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None, *,
                 limits: ConnectionLimits, keyless: Any = None,
                 failed_auth: FailedAuth | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)  # type: ignore[call-arg]
        self._limits = limits
        self._keyless = keyless  # the app's `keyless_refusal`, or None
        self._failed_auth = failed_auth  # the server's, shared by its connections
        self.logger = ClientLog(self.logger, handshakes=False)  # type: ignore[has-type]
        self.access_logger = ClientLog(self.access_logger,  # type: ignore[has-type]
                                       handshakes=True)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_CoalescedWrites(transport, self.loop))  # type: ignore[misc]
        if len(self.connections) > self._limits.max_connections:  # type: ignore[attr-defined]
            self._refuse()
            return
        self._waiting_since = self.loop.time()  # type: ignore[attr-defined]
        _Sweep.watch(self)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # read and dropped: unread bytes would turn our close into a reset
        super().data_received(data)  # type: ignore[misc]

    def handle_websocket_upgrade(self, *event: Any) -> None:
        # A WebSocket writes each message as one frame: held a loop step, it only waits.
        coalesced = self.transport  # type: ignore[has-type]
        coalesced.flush()
        self.transport = coalesced._transport
        super().handle_websocket_upgrade(*event)  # type: ignore[misc]

    def _close_if_overdue(self, now: float) -> None:
        """Note what the connection waits for; close it when that is late."""
        transport = self.transport  # type: ignore[attr-defined]
        if transport.is_closing():
            return
        cycle = self.cycle  # type: ignore[attr-defined]
        what = "headers" if cycle is None or cycle.response_complete else \
            "body" if cycle.more_body else None
        if cycle is not self._seen_cycle or what != self._waiting_for:
            # A new wait: its deadline counts from now (as the sweep saw it begin).
            self._seen_cycle, self._waiting_for, self._waiting_since = cycle, what, now
            return
        if what is None:
            return
        limit = self._limits.header_timeout_s if what == "headers" else \
            self._limits.body_timeout_s
        if now - self._waiting_since >= limit:
            logger.debug("closing a connection from %s: request %s not received within %gs",
                         self.client, what, limit)  # type: ignore[attr-defined]
            transport.close()

    def _refuse(self) -> None:
        self._refused = True
        loop = self.loop  # type: ignore[attr-defined]
        if loop.time() - _last_warning[0] > _WARN_EVERY_S:
            _last_warning[0] = loop.time()
            logger.warning("%d connections open (limit %d): new ones are answered 503",
                           len(self.connections),  # type: ignore[attr-defined]
                           self._limits.max_connections)
        transport = self.transport  # type: ignore[attr-defined]
        transport.write(_busy_response(self._limits.max_connections))
        if transport.can_write_eof():
            transport.write_eof()
        loop.call_later(_REFUSED_LINGER_S, transport.close)


    def _refuse_keyless(self, refusal: tuple[bytes, bytes]) -> None:
        """Answer a request that failed the key check from here, before the app; the
        connection reads nothing more. Past its address's budget (`FailedAuth`) the answer
        waits: a client without the key gets its 401 at the pace the server sets."""
        self._refused = True
        loop = self.loop  # type: ignore[attr-defined]
        client = self.client  # type: ignore[attr-defined]
        wait = 0.0 if self._failed_auth is None else \
            self._failed_auth.wait(client[0] if client else "", loop.time())
        if wait:
            loop.call_later(wait, self._answer_keyless, *refusal)
        else:
            self._answer_keyless(*refusal)

    def _answer_keyless(self, head: bytes, body: bytes) -> None:
        transport = self.transport  # type: ignore[attr-defined]
        if transport.is_closing():
            return  # the client gave up waiting
        date = b"".join(k + b": " + v + b"\r\n"
                        for k, v in self.server_state.default_headers)  # type: ignore[attr-defined]
        transport.write(head + date + b"\r\n" + body)
        self._answered = True
        if transport.can_write_eof():
            transport.write_eof()
        if self._request_read:
            transport.close()  # nothing unread is left to turn the close into a reset
        else:
            self.loop.call_later(_REFUSED_LINGER_S, transport.close)  # type: ignore[attr-defined]

    def _keyless_request_read(self) -> None:
        self._request_read = True
        if self._answered:
            self.transport.close()  # type: ignore[attr-defined]


class FailedAuth:
    """Failed key checks by client address, counted by the second. An address's first
    ``budget`` a second are answered at once, the rest after ``wait_s``: a client that waits
    for its answers (every HTTP client) is paced to about one refusal per connection per
    ``wait_s``, however fast it asks, and a keyless flood cannot take the core from the
    clients with the key. A wrong key is still told why, a moment later."""

    def __init__(self, budget: int = 20, wait_s: float = 1.0) -> None:
        self.budget, self.wait_s = budget, wait_s
        self._second = -1
        self._counts: dict[str, int] = {}  # this second's only: its size is bounded

    def wait(self, address: str, now: float) -> float:
        """How long the refusal of ``address``'s request waits (0: none)."""
        second = int(now)
        if second != self._second:
            self._second, self._counts = second, {}
        count = self._counts[address] = self._counts.get(address, 0) + 1
        return 0.0 if count <= self.budget else self.wait_s


class BoundedH11Protocol(_Bounded, H11Protocol):
    """uvicorn's h11 protocol with the kit's bounds: the fallback without httptools."""


if HttpToolsProtocol is not None:
    class BoundedHttpToolsProtocol(_Bounded, HttpToolsProtocol):
        """uvicorn's httptools protocol with the kit's bounds: the fast path. A request that
        fails the key check is answered here (`keyless_refusal`), its app never called."""

        def on_headers_complete(self) -> None:
            if self._keyless is not None and not self.parser.should_upgrade():
                refusal = self._keyless(self.parser.get_method(), self.url.partition(b"?")[0],
                                        self.headers)
                if refusal is not None:
                    if self.access_log:
                        self._log_refused(int(refusal[0][9:12]))
                    self._refuse_keyless(refusal)
                    return
            super().on_headers_complete()

        def _log_refused(self, status: int) -> None:
            # The line uvicorn writes for a request it answers (`ClientLog` shortens it).
            host, port = self.client or ("", 0)
            self.access_logger.info('%s - "%s %s HTTP/%s" %d', f"{host}:{port}",
                                    self.parser.get_method().decode("latin-1"),
                                    self.url.decode("latin-1"),
                                    self.parser.get_http_version(), status)

        def on_body(self, body: bytes) -> None:
            if not self._refused:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if self._refused:
                self._keyless_request_read()
                return
            super().on_message_complete()
else:  # pragma: no cover
    BoundedHttpToolsProtocol = None  # type: ignore[assignment,misc]


class QuietWSProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O protocol over websockets, its handshake lines and websockets' own
    lines logged by `ClientLog`'s rules."""

    def __init__(self, config: Any, server_state: Any, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.logger = ClientLog(self.logger, handshakes=config.access_log)  # type: ignore[assignment]
        self.conn.logger = ClientLog(self.conn.logger, handshakes=config.access_log)


def bounded_protocol() -> type:
    """The protocol class every server uses: httptools' when installed, else h11's."""
    return BoundedHttpToolsProtocol or BoundedH11Protocol


class _CoalescedWrites:
    """The connection's transport, with the writes of one loop step sent as one.

    uvicorn writes a response's head and its body separately, and an idle socket sends each
    at once: two `send` calls, two TCP segments, and two wake-ups of the client for one
    response. Here a write is held until the loop's next step, so a streamed body still goes
    out chunk by chunk; closing sends what is held first. Everything else is the
    transport's own.
    """

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not data:
            return
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(data)

    def flush(self) -> None:
        held = self._held
        if held:
            self._held = []
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._held))

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = []
        self._transport.abort()

    def is_closing(self) -> bool:
        # Asked on every response: spelled out, it skips the lookup through `__getattr__`.
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _Sweep:
    """Every few tenths of a second, closes the server's connections whose deadline passed
    (so a deadline fires up to one interval late). Runs while the server has connections."""

    # By the server's connection set. Weak: a sweep lives while its loop holds its next tick,
    # so a server whose loop ended leaves no entry; a live entry holds its set, so the id is
    # not reused.
    _running: weakref.WeakValueDictionary[int, _Sweep] = weakref.WeakValueDictionary()

    def __init__(self, protocol: _Bounded) -> None:
        limits = protocol._limits
        self.connections = protocol.connections  # type: ignore[attr-defined]
        self.loop = protocol.loop  # type: ignore[attr-defined]
        self.interval = min(limits.header_timeout_s, limits.body_timeout_s, 5.0) / 5

    @classmethod
    def watch(cls, protocol: _Bounded) -> None:
        key = id(protocol.connections)  # type: ignore[attr-defined]
        running = cls._running.get(key)
        if running is None or running.loop is not protocol.loop:  # type: ignore[attr-defined]
            sweep = cls._running[key] = cls(protocol)
            sweep.loop.call_later(sweep.interval, sweep.run, key)

    def run(self, key: int) -> None:
        if self._running.get(key) is not self:
            return  # replaced: its server runs on another loop now
        if not self.connections:
            del self._running[key]  # the next connection starts a new sweep
            return
        now = self.loop.time()
        for protocol in list(self.connections):
            if isinstance(protocol, _Bounded):
                protocol._close_if_overdue(now)
        self.loop.call_later(self.interval, self.run, key)


__all__ = ["BoundedH11Protocol", "BoundedHttpToolsProtocol", "FailedAuth", "QuietWSProtocol",
           "bounded_protocol"]
