"""The client a served app calls out with spreads concurrent requests over small pools.

httpcore's pool does work quadratic in its connections per request (see `_outbound`); the
spread keeps every pool small without lowering how many connections the client holds.
"""

from __future__ import annotations

import asyncio

import httpx
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from synth_deploy.taskapp._outbound import outbound_client


def held_until_all_arrive(count: int) -> Starlette:
    """An app answering each request only once ``count`` of them are open at the same time."""
    arrived: list[asyncio.Event] = []

    async def hold(request):
        event = asyncio.Event()
        arrived.append(event)
        if len(arrived) % count == 0:
            for waiting in arrived[-count:]:
                waiting.set()
        await asyncio.wait_for(event.wait(), 10)
        return PlainTextResponse("x" * 1000)

    async def now(request):
        return PlainTextResponse("x" * 1000)

    return Starlette(routes=[Route("/hold", hold), Route("/now", now)])


def test_concurrent_requests_spread_over_the_pools_and_give_their_slots_back(serve):
    server = serve(held_until_all_arrive(16))

    async def main():
        async with outbound_client(allow_link_local=False) as client:
            spread = client._transport
            answers = await asyncio.gather(*(client.get(server.url + "/hold")
                                             for _ in range(16)))
            assert [a.status_code for a in answers] == [200] * 16
            assert all(len(a.text) == 1000 for a in answers)
            # 16 at once over 8 pools: two connections each, not 16 in one pool
            assert [len(pool._pool.connections) for pool in spread.pools] == [2] * 8
            assert spread._in_flight == [0] * 8
            # A streamed body holds its slot until it is closed, then gives it back.
            async with client.stream("GET", server.url + "/now") as streamed:
                assert sum(spread._in_flight) == 1
                assert len(await streamed.aread()) == 1000
            assert spread._in_flight == [0] * 8
            later = await asyncio.gather(*(client.get(server.url + "/hold") for _ in range(16)))
            assert {a.status_code for a in later} == {200} and spread._in_flight == [0] * 8
            # connections are reused, not opened again
            assert sum(len(pool._pool.connections) for pool in spread.pools) == 16

    asyncio.run(main())


def test_a_failed_request_gives_its_slot_back():
    async def main():
        async with outbound_client(allow_link_local=False) as client:
            try:
                await client.get("http://127.0.0.1:9/", timeout=2)  # discard port: refused
            except httpx.ConnectError:
                pass
            assert client._transport._in_flight == [0] * 8

    asyncio.run(main())
