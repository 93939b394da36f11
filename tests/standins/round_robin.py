"""Modal's load balancer in front of a deployment's containers, as far as a client sees it:
each request goes to the next container in turn (round robin), so a client's next request
lands on any of them; a container that refuses the connection (dead) is skipped for the next,
as Modal stops routing to a container it lost (a GET it dropped is sent to the next; any
other request it dropped is a 502). Real HTTP both ways, loopback only. Put the
strict front end in front of it, as Modal's is in front of its balancer:

    with RoundRobinRouter(container_urls) as router, StrictModalFrontEnd(router.url) as front:
        httpx.get(front.url + "/containers/rollouts/r-1")
"""

from __future__ import annotations

import itertools
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import Response

from standins.cutoff_proxies import _Proxy, _relayed


class RoundRobinRouter(_Proxy):
    def __init__(self, origin_urls: list[str]) -> None:
        super().__init__(origin_urls[0])
        self.origins = [url.rstrip("/") for url in origin_urls]
        self._turns = itertools.cycle(range(len(self.origins)))
        self.sent = [0] * len(self.origins)  # requests each container was given

    async def handle(self, request: Request) -> Response:
        for _ in self.origins:
            turn = next(self._turns)
            self.origin_url = self.origins[turn]  # the request is built for this container
            upstream_request = await self.origin_request(request)
            try:
                upstream = await self._client.send(upstream_request, stream=True)
            except httpx.ConnectError:
                continue  # a container gone: the balancer routes to another
            except Exception:  # noqa: BLE001 - a socket gone mid-connect fails as it can
                if request.method == "GET":  # it died holding the request: another answers
                    continue
                return Response("upstream connection lost", status_code=502,
                                media_type="text/plain")
            self.sent[turn] += 1

            async def relay(upstream: httpx.Response = upstream) -> Any:
                try:
                    async for chunk in upstream.aiter_raw():
                        yield chunk
                finally:
                    await upstream.aclose()

            return _relayed(upstream, relay())
        return Response("no container is up", status_code=503, media_type="text/plain")
