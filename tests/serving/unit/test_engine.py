"""The engine's unit layer: the app `create_app` builds, called as raw ASGI on the test's
loop (tests/asgi_harness.py), no socket, no child process. Each test pins one promise a
reviewer asks about (who may call what, admission and its 503, the early head) and orders
events with asyncio.Event, never a sleep.

    pytest tests/serving/unit -q        # the whole layer, in seconds
"""

from __future__ import annotations

import asyncio

import pytest
from asgi_harness import Harness
from toy_apps import env_config, toy_config

from synth_deploy.serving import RolloutLimits, create_app
from synth_deploy.taskapp import RolloutContext, RolloutRequest

KEY = "sk_env_unit_0123456789abcdef"
ROLLOUT = {"run_id": "r", "env": {"seed": 1}, "policy": {"config": {}}}

# What answers without the key, and nothing else: the app's liveness and what
# `openenv validate` reads (the environment's name, schemas, capacity, its OpenAPI document
# and MCP's answer that it serves no tools without a session).
PUBLIC = {("GET", "/"), ("HEAD", "/"), ("GET", "/openenv/health"),
          ("GET", "/openenv/metadata"), ("GET", "/openenv/schema"),
          ("GET", "/openenv/openapi.json"), ("POST", "/openenv/mcp")}


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 30))


class Gate:
    """A rollout that runs until the test opens its gate; ``started`` is set as it begins."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.open = asyncio.Event()

    async def __call__(self, request: RolloutRequest, ctx: RolloutContext) -> dict:
        self.started.set()
        await self.open.wait()
        return {"run_id": request.run_id, "metrics": {"episode_rewards": [1.0]}}


def declared_routes(app) -> list[tuple[str, str, bool]]:
    """(method, path, websocket) of every route the app declares."""
    found = []
    for route in app.routes:
        declaration = getattr(route, "declaration", None)
        if declaration is None:
            continue
        for method in declaration.method_list:
            found.append((method, route.path, declaration.websocket))
    return found


def test_every_route_but_the_public_ones_refuses_a_client_without_the_key():
    app = create_app(env_config(), api_keys=[KEY])

    async def keyless_answers() -> dict[tuple[str, str], int]:
        answers = {}
        async with Harness(app) as harness:
            for method, path, websocket in declared_routes(app):
                if websocket:
                    continue
                body = ROLLOUT if method == "POST" else None
                answers[(method, path)] = (await harness.request(method, path,
                                                                 body=body)).status
        return answers

    answers = run(keyless_answers())
    assert len(answers) >= 12  # the core routes and OpenEnv's, all seen
    public = {route for route, status in answers.items() if status != 401}
    assert public == PUBLIC


def test_a_keyless_websocket_is_refused_at_the_handshake():
    app = create_app(env_config(), api_keys=[KEY])

    async def handshakes() -> tuple[list, list]:
        async with Harness(app) as harness:
            return (await harness.websocket("/openenv/ws"),
                    await harness.websocket("/openenv/ws", key=KEY))

    keyless, keyed = run(handshakes())
    assert keyless[0]["type"] == "websocket.http.response.start"
    assert keyless[0]["status"] == 401
    assert not any(m["type"] == "websocket.accept" for m in keyless)
    assert keyed[0]["type"] == "websocket.accept"


def test_a_rollout_past_capacity_is_answered_503_with_retry_after_before_it_runs():
    gate = Gate()
    calls = []

    async def counted(request, ctx):
        calls.append(request.run_id)
        return await gate(request, ctx)

    app = create_app(toy_config(counted), api_keys=[KEY], limits=RolloutLimits(max_in_flight=1))

    async def scenario():
        async with Harness(app) as harness:
            first, task = harness.send("POST", "/rollout", key=KEY, body=ROLLOUT)
            await gate.started.wait()
            refused = await harness.request("POST", "/rollout", key=KEY,
                                            body={**ROLLOUT, "run_id": "second"})
            health = (await harness.request("GET", "/health", key=KEY)).json()
            gate.open.set()
            await task
            return first, refused, health

    first, refused, health = run(scenario())
    assert first.status == 200
    assert refused.status == 503
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["detail"]["error"]["code"] == "at_capacity"
    assert calls == ["r"]  # the refused rollout never ran
    assert health["rollouts"]["in_flight"] == 1


def test_a_slot_freed_by_a_finished_rollout_admits_the_next_and_refusals_are_counted():
    gate = Gate()
    app = create_app(toy_config(gate), api_keys=[KEY], limits=RolloutLimits(max_in_flight=2))

    async def scenario():
        async with Harness(app) as harness:
            running = [harness.send("POST", "/rollout", key=KEY, body={**ROLLOUT, "run_id": n})
                       for n in ("a", "b")]
            while app.state.stats.in_flight < 2:  # both admitted, each waiting at the gate
                await asyncio.sleep(0)
            third = await harness.request("POST", "/rollout", key=KEY, body=ROLLOUT)
            gate.open.set()
            await asyncio.gather(*(task for _, task in running))
            fourth = await harness.request("POST", "/rollout", key=KEY, body=ROLLOUT)
            return [a.status for a, _ in running], third.status, fourth.status

    statuses, third, fourth = run(scenario())
    assert statuses == [200, 200]
    assert (third, fourth) == (503, 200)
    stats = app.state.stats.snapshot()
    assert (stats["refused"], stats["rollouts"], stats["in_flight"]) == (1, 3, 0)


def test_a_long_rollout_gets_its_200_head_and_heartbeats_before_its_body():
    gate = Gate()
    limits = RolloutLimits(head_after_s=0.05, heartbeat_s=0.02)
    app = create_app(toy_config(gate), api_keys=[KEY], limits=limits)

    async def scenario():
        async with Harness(app) as harness:
            answer, task = harness.send("POST", "/rollout", key=KEY, body=ROLLOUT)
            await answer.head.wait()  # sent while the rollout still runs
            assert not gate.open.is_set() and not answer.done.is_set()
            while sum(m.get("body") == b" " for m in answer.messages) < 2:
                await asyncio.sleep(0.01)  # heartbeats on the head's schedule
            gate.open.set()
            await task
            return answer

    answer = run(scenario())
    assert answer.status == 200
    assert answer.body.startswith(b"  ")
    assert answer.json()["metrics"]["episode_rewards"] == [1.0]


def test_a_short_rollout_is_answered_with_its_own_status_and_no_heartbeat():
    limits = RolloutLimits(head_after_s=5.0, heartbeat_s=5.0)
    app = create_app(toy_config(), api_keys=[KEY], limits=limits)

    async def scenario():
        async with Harness(app) as harness:
            return await harness.request("POST", "/rollout", key=KEY, body=ROLLOUT)

    answer = run(scenario())
    assert answer.status == 200
    assert not answer.body.startswith(b" ")


@pytest.mark.parametrize("body, code", [(b"{", "invalid_json"), ({"env": {}}, "invalid_request")])
def test_a_malformed_rollout_is_a_422_that_names_the_fault(body, code):
    app = create_app(toy_config(), api_keys=[KEY])

    async def scenario():
        async with Harness(app) as harness:
            return await harness.request("POST", "/rollout", key=KEY, body=body)

    answer = run(scenario())
    assert answer.status == 422
    assert answer.json()["detail"]["error"]["code"] == code
