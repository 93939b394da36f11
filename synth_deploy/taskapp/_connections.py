"""uvicorn's HTTP/1.1 protocol, with the bounds it lacks (how long a request may take to
arrive, how many connections may be open at once) and a response sent in one piece.

uvicorn starts its keep-alive timer only after a first response, and any byte resets it, so a
client that connects and sends nothing (or a header byte every few seconds) holds its
connection, and a file descriptor, forever; at the default limit of 1,024 open files the
server stops accepting. Here:

- a request's headers must arrive within ``header_timeout_s`` of the connection opening (or of
  the previous response), and its body within ``body_timeout_s`` of the headers, or the
  connection is closed;
- beyond ``max_connections`` open connections a new one is answered 503 at once and closed,
  so a crowd gets a prompt "come back later" instead of a hang;
- a keep-alive connection that sends nothing for ``keep_alive_s`` after a response is closed
  by the same sweep that checks the deadlines, in place of uvicorn's timer, which it arms
  and cancels on every request (2% of the instructions a trivial rollout takes).

Settings come from `ConnectionLimits` (see `_runner`, the one place uvicorn is configured).
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from typing import TYPE_CHECKING, Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

if TYPE_CHECKING:
    from synth_deploy.taskapp._runner import ConnectionLimits

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


class BoundedH11Protocol(H11Protocol):
    """`H11Protocol` with request deadlines and a connection cap (see the module docstring).

    Deadlines are checked by one sweep per server (`_Sweep`), not a timer per request: a
    connection only notes what it waits for and since when, which costs nothing next to
    arming and cancelling a loop timer twice per request.
    """

    def __init__(self, config: Any, server_state: Any, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None, *,
                 limits: ConnectionLimits) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._limits = limits
        self._refused = False
        # "idle" (between requests), "headers" or "body" while a deadline runs
        self._waiting_for: str | None = None
        self._waiting_since = 0.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_CoalescedWrites(transport, self.loop))  # type: ignore[arg-type]
        if len(self.connections) > self._limits.max_connections:
            self._refuse()
            return
        _Sweep.watch(self)
        self._track()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # read and dropped: unread bytes would turn our close into a reset
        if self._waiting_for == "idle":
            self._waiting_for = "headers"  # a next request began: its deadline still counts
        super().data_received(data)
        self._track()

    def on_response_complete(self) -> None:
        self.transport.flush()  # the whole response in one send, before the next request
        # uvicorn's own steps (the same from 0.29 on), without arming its keep-alive timer.
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
            self.handle_events()  # a pipelined request, already received
        if self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]:
            self._waiting_for, self._waiting_since = "idle", self.loop.time()
        else:
            self._track()

    # -- deadlines -------------------------------------------------------------------------

    def _track(self) -> None:
        """Note what the client owes us next; a running request has no deadline."""
        state = self.conn.their_state
        if state is h11.IDLE:
            what = "idle" if self._waiting_for == "idle" else "headers"
        else:
            what = "body" if state is h11.SEND_BODY else None
        if what != self._waiting_for:
            # The deadline counts from when we started waiting, not from the last byte.
            self._waiting_for, self._waiting_since = what, self.loop.time()

    def _close_if_overdue(self, now: float) -> None:
        """Close the connection when what it waits for is late."""
        what = self._waiting_for
        if what is None or self.transport.is_closing():
            return
        limits = self._limits
        limit = limits.keep_alive_s if what == "idle" else limits.header_timeout_s \
            if what == "headers" else limits.body_timeout_s
        if now - self._waiting_since < limit:
            return
        self._waiting_for = None
        if what == "idle":
            self.timeout_keep_alive_handler()  # uvicorn's: says the connection is closed, closes
            return
        logger.debug("closing a connection from %s: request %s not received within %gs",
                     self.client, what, limit)
        self.transport.close()


    # -- the cap ---------------------------------------------------------------------------

    def _refuse(self) -> None:
        self._refused = True
        if self.loop.time() - _last_warning[0] > _WARN_EVERY_S:
            _last_warning[0] = self.loop.time()
            logger.warning("%d connections open (limit %d): new ones are answered 503",
                           len(self.connections), self._limits.max_connections)
        self.transport.write(_busy_response(self._limits.max_connections))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(_REFUSED_LINGER_S, self.transport.close)


class _CoalescedWrites:
    """The connection's transport, with the writes of one loop step sent as one.

    uvicorn writes a response's head and its body separately, and an idle socket sends each
    at once: two `send` calls, two TCP segments, and two wake-ups of the client for one
    response (on a trivial rollout, the load client spent a fifth more CPU per response for
    it). Here a write is held until the response completes or the loop's next step, whichever
    is first, so a streamed body still goes out chunk by chunk; closing sends what is held
    first. Everything else is the transport's own.
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
        # Asked once per response: spelled out, it skips the failed lookup that reaches
        # `__getattr__` (a microsecond a request).
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

    def __init__(self, protocol: BoundedH11Protocol) -> None:
        limits = protocol._limits
        self.connections = protocol.connections
        self.loop = protocol.loop
        self.interval = min(limits.header_timeout_s, limits.body_timeout_s,
                            limits.keep_alive_s, 5.0) / 5

    @classmethod
    def watch(cls, protocol: BoundedH11Protocol) -> None:
        key = id(protocol.connections)
        running = cls._running.get(key)
        if running is None or running.loop is not protocol.loop:  # none, or its loop ended
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
            if isinstance(protocol, BoundedH11Protocol):
                protocol._close_if_overdue(now)
        self.loop.call_later(self.interval, self.run, key)


__all__ = ["BoundedH11Protocol"]
