"""`PromptStopServer`: uvicorn's server, stopping as soon as its work is done.

uvicorn's main loop looks at ``should_exit`` every 0.1 s, and its shutdown sleeps 0.1 s, then
checks for open connections every 0.1 s: a server on a thread (smoke, eval, the tunnel, every
test) took a quarter of a second to stop with nothing left to do. Here the loop wakes when
asked, and the drain is checked every 10 ms; what is drained, and the graceful bound, are
uvicorn's.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable

import uvicorn

logger = logging.getLogger("uvicorn.error")
DRAIN_SAID_EVERY_S = 5.0  # a drain that waits says so again this often


class PromptStopServer(uvicorn.Server):
    """``on_started``: called on the server's loop once its sockets are bound. While a
    shutdown drains, what it waits for is logged at once and every few seconds: the open
    connections, and ``pending()`` (the app's words for its work, e.g. "2 rollouts in
    flight"; None: nothing). ``on_drained``: called once the drain has ended."""

    _loop: asyncio.AbstractEventLoop | None = None
    _wake: asyncio.Event | None = None

    def __init__(self, config: uvicorn.Config,
                 on_started: Callable[[], None] | None = None, *,
                 pending: Callable[[], str | None] | None = None,
                 on_drained: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self.on_started = on_started
        self.pending, self.on_drained = pending, on_drained

    async def main_loop(self) -> None:
        # uvicorn's loop (a tick every 0.1 s: the date header, max requests), woken early by
        # `request_stop`.
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        if self.on_started is not None:
            self.on_started()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 1) % 864000
            try:
                await asyncio.wait_for(self._wake.wait(), 0.1)
            except TimeoutError:
                pass
            should_exit = await self.on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:  # no new connections
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):  # idle ones close now
            connection.shutdown()
        try:
            async with asyncio.timeout(self.config.timeout_graceful_shutdown):
                await self._drained()
        except TimeoutError:
            logger.error("Cancel %s running task(s), timeout graceful shutdown exceeded",
                         len(self.server_state.tasks))
            for task in self.server_state.tasks:
                task.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")
        if self.on_drained is not None:
            self.on_drained()
        if not self.force_exit:
            await self.lifespan.shutdown()

    async def _drained(self) -> None:
        """Until the open connections have sent their responses, the requests' tasks end
        and the listening servers are closed (uvicorn's `_wait_tasks_to_complete`)."""
        state = self.server_state
        loop = asyncio.get_running_loop()
        say_at = loop.time()
        while (state.connections or state.tasks) and not self.force_exit:
            if loop.time() >= say_at:
                self._say_waiting()
                say_at = loop.time() + DRAIN_SAID_EVERY_S
            await asyncio.sleep(0.01)
        for server in self.servers:
            await server.wait_closed()

    def _say_waiting(self) -> None:
        connections = len(self.server_state.connections)
        what = [w for w in (self.pending() if self.pending else None,
                            f"{connections} open connection{'' if connections == 1 else 's'}"
                            if connections else None) if w]
        if not what:
            return
        bound = self.config.timeout_graceful_shutdown
        logger.info("draining: waiting for %s (%sCtrl+C stops now)", ", ".join(what),
                    f"at most {bound:g}s; " if bound is not None else "")

    def request_stop(self) -> None:
        """Ask the server to stop, from any thread; it begins at once."""
        self.should_exit = True
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # the loop has already closed: nothing left to wake
                pass


__all__ = ["PromptStopServer"]
