"""A TCP proxy that forgets idle connections without telling anyone (loopback only).

It stands in for what sits between a trainer and a task app in production (a NAT, a load
balancer, a cloud proxy): bytes are forwarded both ways, but a connection that carried nothing
for ``forget_after_s`` is dropped from its table. Neither side is told (no FIN): the client's
next request on that connection is answered with a TCP reset, as a real middlebox does for a
flow it no longer knows. The upstream closing its side is not passed on either.

    with IdleDroppingProxy("127.0.0.1", 8001, forget_after_s=1.0) as proxy:
        proxy.url            # http://127.0.0.1:PORT, forwarding to 127.0.0.1:8001
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time


class IdleDroppingProxy:
    """A real proxy on its own event loop thread; a context manager that stops it."""

    def __init__(self, upstream_host: str, upstream_port: int, *, forget_after_s: float) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.forget_after_s = forget_after_s
        self.resets = 0  # connections answered with a reset
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> IdleDroppingProxy:
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        started.result(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in handlers:
            task.cancel()
        # Let each run its `finally` now: one the closed loop collects later closes its
        # streams on that loop, an error that surfaces in whatever test runs then.
        await asyncio.gather(*handlers, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        last = time.monotonic()

        async def client_to_upstream() -> None:
            nonlocal last
            while data := await reader.read(65536):
                if time.monotonic() - last > self.forget_after_s:
                    self.resets += 1
                    # SO_LINGER 0: close() sends a reset, not a FIN.
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    writer.transport.abort()
                    up_writer.close()
                    return
                last = time.monotonic()
                up_writer.write(data)
                await up_writer.drain()

        async def upstream_to_client() -> None:
            nonlocal last
            while data := await up_reader.read(65536):
                last = time.monotonic()
                writer.write(data)
                await writer.drain()
            # The upstream closed its side: a middlebox that forgot the flow says nothing.

        try:
            await asyncio.gather(client_to_upstream(), upstream_to_client())
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass
        finally:
            for w in (writer, up_writer):
                if not w.is_closing():
                    w.close()
