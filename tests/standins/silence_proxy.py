"""A TCP proxy with a short time limit (loopback only): a request whose answer has not begun
within ``silence_s`` has its connection closed, nothing sent back. It stands in for a proxy on
the path (a corporate proxy, a load balancer) whose limit is shorter than a rollout.

    with SilenceCuttingProxy("127.0.0.1", 8001, silence_s=1.0) as proxy:
        proxy.url            # http://127.0.0.1:PORT, forwarding to 127.0.0.1:8001
"""

from __future__ import annotations

import asyncio

from standins.idle_proxy import IdleDroppingProxy


class SilenceCuttingProxy(IdleDroppingProxy):
    def __init__(self, upstream_host: str, upstream_port: int, *, silence_s: float) -> None:
        super().__init__(upstream_host, upstream_port, forget_after_s=silence_s)
        self.cut = 0  # connections closed on a silent upstream

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        answered = asyncio.Event()

        async def client_to_upstream() -> None:
            while data := await reader.read(65536):
                answered.clear()
                up_writer.write(data)
                await up_writer.drain()
                try:
                    await asyncio.wait_for(answered.wait(), self.forget_after_s)
                except TimeoutError:
                    self.cut += 1
                    writer.close()
                    up_writer.close()
                    return

        async def upstream_to_client() -> None:
            while data := await up_reader.read(65536):
                answered.set()
                writer.write(data)
                await writer.drain()

        try:
            await asyncio.gather(client_to_upstream(), upstream_to_client())
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass
        finally:
            for w in (writer, up_writer):
                if not w.is_closing():
                    w.close()
