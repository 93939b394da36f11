"""An async rollout always ends: a terminate or a lease expiry landing at any moment of its
run, its finishing and its storing included, leaves a terminal state and gives its slot
back; finished rollouts held in memory are bounded. A real server on loopback, a real trace
file."""

from __future__ import annotations

import asyncio
import random

import httpx
from toy_apps import toy_config

from synth_deploy.serving import RolloutLimits, create_app
from synth_deploy.taskapp import RolloutContext, RolloutRequest
from synth_deploy.tracing import RolloutRecords, open_trace_store

RACES = 1_000


async def _short(request: RolloutRequest, ctx: RolloutContext) -> dict:
    await asyncio.sleep(float(request.env.config["sleep"]))
    return {"run_id": request.run_id, "metrics": {"outcome_reward": 1.0}}


def _body(rollout_id: str, sleep: float, ttl: float | None) -> dict:
    body = {"rollout_id": rollout_id, "seed": 1, "submission_mode": "async",
            "env": {"config": {"sleep": sleep}},
            "policy": {"model": "m", "inference_url": "http://127.0.0.1:9/v1"}}
    if ttl is not None:
        body["lease_ttl_seconds"] = ttl
    return body


async def _race(c: httpx.AsyncClient, i: int, rng: random.Random) -> str:
    """One rollout raced by a terminate (even ``i``) or its lease (odd) around its end."""
    sleep = rng.uniform(0.0, 0.012)
    rollout_id = f"race-{i}"
    if i % 2 == 0:
        resp = await c.post("/rollouts", json=_body(rollout_id, sleep, None))
        assert resp.status_code == 202, resp.text
        await asyncio.sleep(max(0.0, sleep + rng.uniform(-0.006, 0.006)))
        await c.post(f"/rollouts/{rollout_id}/terminate")
    else:  # the lease ends about when the rollout does; nothing renews it meanwhile
        ttl = max(0.001, sleep + rng.uniform(-0.006, 0.006))
        resp = await c.post("/rollouts", json=_body(rollout_id, sleep, ttl))
        assert resp.status_code == 202, resp.text
        await asyncio.sleep(sleep + ttl + 0.05)
    for _ in range(400):
        doc = (await c.get(f"/rollouts/{rollout_id}")).json()
        if doc["status"] != "running":
            return doc["status"]
        await asyncio.sleep(0.025)
    return "stuck"


def test_terminate_and_lease_expiry_raced_against_finishing(tmp_path, serve, api_key):
    rng = random.Random(64)
    with open_trace_store(str(tmp_path / "t.db")) as store:
        app = serve(create_app(toy_config(_short), api_keys=[api_key], trace_store=store,
                               rollout_records=RolloutRecords(store),
                               limits=RolloutLimits(max_in_flight=64)))

        async def races() -> list[str]:
            gate = asyncio.Semaphore(48)  # under the server's 64 slots: no 503 expected

            async def one(i: int) -> str:
                async with gate:
                    return await _race(c, i, rng)

            async with httpx.AsyncClient(base_url=app.url + "/containers", timeout=30,
                                         headers={"X-API-Key": api_key}) as c:
                return await asyncio.gather(*(one(i) for i in range(RACES)))

        statuses = asyncio.run(races())
        health = httpx.get(app.url + "/health", headers={"X-API-Key": api_key}).json()
    stuck = statuses.count("stuck")
    assert stuck == 0, f"{stuck} of {RACES} rollouts never reached a terminal state"
    assert set(statuses) <= {"completed", "cancelled"}, set(statuses)
    assert health["rollouts"]["in_flight"] == 0  # every slot given back
    # Both ends of the race were reached: some finished first, some were stopped first.
    assert statuses.count("completed") and statuses.count("cancelled")


def test_finished_rollouts_in_memory_are_bounded(serve, api_key):
    """With no store, a finished rollout stays until its end is read (a crowd that ends at
    once is never lost to its own pollers), then only the newest 1,000 do (404 after)."""
    app = serve(create_app(toy_config(), api_keys=[api_key]))

    async def submit(ids: range) -> list[int]:
        gate = asyncio.Semaphore(32)

        async def one(i: int) -> int:
            async with gate:
                return (await c.post("/rollouts", json=_body(f"m-{i}", 0, None))).status_code

        async with httpx.AsyncClient(base_url=app.url + "/containers", timeout=30,
                                     headers={"X-API-Key": api_key}) as c:
            return await asyncio.gather(*(one(i) for i in ids))

    def read(c: httpx.Client, i: int) -> int:
        resp = c.get(f"/rollouts/m-{i}", params={"wait_ms": 5000})
        assert resp.status_code == 404 or resp.json()["status"] == "completed", resp.text
        return resp.status_code

    assert set(asyncio.run(submit(range(1_050)))) == {202}
    with httpx.Client(base_url=app.url + "/containers", timeout=30,
                      headers={"X-API-Key": api_key}) as c:
        # 1,050 ended, none read yet: all still answered, each read once.
        assert [read(c, i) for i in range(1_050)] == [200] * 1_050
        assert set(asyncio.run(submit(range(1_050, 1_051)))) == {202}
        assert read(c, 1_050) == 200
        # Read, and past the newest 1,000: let go.
        assert [read(c, i) for i in range(20)] == [404] * 20
        assert read(c, 1_049) == 200
        health = c.get(app.url + "/health").json()
    assert health["rollouts"]["in_flight"] == 0
