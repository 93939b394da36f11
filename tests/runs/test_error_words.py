"""Errors that left a first-time user guessing: each now says what happened and what to do."""

from __future__ import annotations

import asyncio

import httpx

from synth_deploy.runs import PolicyTarget, run_rollouts


def outcomes_for(handler) -> dict[int, str]:
    policy = PolicyTarget("http://127.0.0.1:9/v1", "m")
    outcomes = asyncio.run(run_rollouts("http://app.test", "k", [0, 1, 2], policy,
                                        transport=httpx.MockTransport(handler)))
    return {o.seed: o.error for o in outcomes}


def test_a_bare_proxy_status_and_an_empty_transport_error_are_said_in_words():
    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path != "/rollout":  # an app without synth-containers' contract
            return httpx.Response(404, json={"detail": "Not Found"})
        seed = __import__("json").loads(request.content)["env"]["seed"]
        if seed == 0:  # Cloudflare's 524 after a silent origin: an empty body, here
            return httpx.Response(524, content=b"")
        if seed == 1:  # a connection cut with nothing said: httpx's message is empty
            raise httpx.ReadError("")
        return httpx.Response(500, content=b"")

    errors = outcomes_for(handler)
    assert errors[0].startswith("HTTP 524: a proxy") and "head sooner" in errors[0]
    assert errors[1] == ("ReadError: the connection was closed before an answer came (the "
                         "app crashed, or a proxy on the path cut it)")
    assert errors[2] == "HTTP 500: no body"
