"""The client a served app calls out with (``ctx.http``, and the policy call) spreads
concurrent requests over small pools.

httpcore's pool does work quadratic in its connections per request (see `_outbound`); the
spread keeps every pool small without lowering how many connections the client holds.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from standins.health_servers import SelfSignedTLSServer, self_signed_cert
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from toy_apps import toy_config

from synth_deploy.serving import create_app
from synth_deploy.tls import client_ssl_context


def held_until_all_arrive(count: int) -> Starlette:
    """An upstream answering each /hold only once ``count`` of them are open at once."""
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


def run_in_app(serve, api_key, body) -> dict:
    """Run ``body(ctx.http)`` inside a rollout of a served app; what it returns."""
    seen: dict = {}

    async def rollout_fn(request, ctx):
        seen.update(await body(ctx.http))
        return {"metrics": {"episode_rewards": [1.0]}}

    app = serve(create_app(toy_config(rollout_fn), api_keys=[api_key]))
    resp = httpx.post(app.url + "/rollout", headers={"X-API-Key": api_key}, timeout=30,
                      json={"run_id": "pools-1"})
    assert resp.status_code == 200, resp.text
    return seen


def test_concurrent_requests_spread_over_the_pools_and_give_their_slots_back(serve, api_key):
    upstream = serve(held_until_all_arrive(16))

    async def body(client):
        spread = client._transport.plain  # the upstream is plain HTTP
        answers = await asyncio.gather(*(client.get(upstream.url + "/hold")
                                         for _ in range(16)))
        seen = {"answers": [(a.status_code, len(a.text)) for a in answers],
                # 16 at once over 8 pools: two connections each, not 16 in one pool
                "connections": [len(pool._pool.connections) for pool in spread.pools],
                "after": list(spread._in_flight)}
        # A streamed body holds its slot until it is closed, then gives it back.
        async with client.stream("GET", upstream.url + "/now") as streamed:
            seen["streaming"] = sum(spread._in_flight)
            await streamed.aread()
        seen["streamed"] = list(spread._in_flight)
        await asyncio.gather(*(client.get(upstream.url + "/hold") for _ in range(16)))
        # the second round reuses the connections the first one opened
        seen["reused"] = sum(len(pool._pool.connections) for pool in spread.pools)
        return seen

    seen = run_in_app(serve, api_key, body)
    assert seen["answers"] == [(200, 1000)] * 16
    assert seen["connections"] == [2] * 8
    assert seen["after"] == seen["streamed"] == [0] * 8 and seen["streaming"] == 1
    assert seen["reused"] == 16


def test_a_failed_request_gives_its_slot_back(serve, api_key):
    async def body(client):
        try:
            await client.get("http://127.0.0.1:9/", timeout=2)  # the discard port: refused
        except httpx.ConnectError:
            pass
        return {"after": list(client._transport.plain._in_flight)}

    assert run_in_app(serve, api_key, body)["after"] == [0] * 8


@pytest.fixture
def trusted_cert(tmp_path, monkeypatch):
    """A self-signed certificate that the kit's TLS context trusts (SSL_CERT_FILE)."""
    certfile, keyfile = self_signed_cert(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(certfile))
    client_ssl_context.cache_clear()
    yield certfile, keyfile
    monkeypatch.delenv("SSL_CERT_FILE")
    client_ssl_context.cache_clear()


def test_certificates_are_loaded_at_the_first_https_request_only(serve, api_key, tmp_path,
                                                                  trusted_cert):
    upstream = serve(held_until_all_arrive(1))
    (tmp_path / "other").mkdir()
    other_cert, other_key = self_signed_cert(tmp_path / "other")

    async def body(client):
        seen = {"plain": (await client.get(upstream.url + "/now")).status_code,
                "tls_after_plain": client._transport.tls is not None}
        with SelfSignedTLSServer(*trusted_cert) as trusted:
            seen["https"] = (await client.get(trusted.url)).text
        seen["tls_after_https"] = client._transport.tls is not None
        with SelfSignedTLSServer(other_cert, other_key) as untrusted:
            try:
                await client.get(untrusted.url)
                seen["untrusted"] = "answered"
            except httpx.ConnectError as exc:
                seen["untrusted"] = str(exc)
        return seen

    seen = run_in_app(serve, api_key, body)
    assert seen["plain"] == 200 and seen["tls_after_plain"] is False
    assert seen["https"] == "{}" and seen["tls_after_https"] is True
    assert "CERTIFICATE_VERIFY_FAILED" in seen["untrusted"]
