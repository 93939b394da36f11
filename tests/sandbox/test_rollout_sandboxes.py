"""A rollout's sandboxes end with it, however it ends (in-process server, real HTTP)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from sandbox_processes import sandbox_processes, wait_for
from toy_apps import toy_config

from synth_deploy.sandbox import LocalBackend, SandboxSettings, live_sandboxes, use_backend
from synth_deploy.serving import create_app


@pytest.fixture
def backend(sandbox_root):
    backend = LocalBackend(sandbox_root)
    use_backend(backend)
    yield backend
    use_backend(None)


def held(backend) -> list:
    return [p for p in backend.root.glob("*/*") if p.is_dir()]


def post(server, api_key, **extra):
    body = {"run_id": "r1", "env": {"seed": 1}, "mode": "eval",
            "policy": {"config": {"model": "m", "inference_url": "http://127.0.0.1:9/v1"}},
            **extra}
    return httpx.post(server.url + "/rollout", json=body, headers={"X-API-Key": api_key},
                      timeout=30)


ids: list[str] = []


async def holds_a_sandbox(request, ctx):
    box = await ctx.sandbox()
    ids.append(box.id)
    await box.run("sleep 300 > /dev/null 2>&1 &")
    how = request.env.config.get("end", "return")
    if how == "raise":
        raise RuntimeError("the app failed")
    if how == "hang":
        await asyncio.sleep(300)
    ctx.tracer.record_outcome_reward(1.0)
    return {"metrics": {"episode_rewards": [1.0]}}


@pytest.mark.parametrize("how,status", [("return", 200), ("raise", 500), ("hang", 504)])
def test_a_rollouts_sandbox_ends_however_the_rollout_ends(serve, api_key, backend, how,
                                                          status):
    server = serve(create_app(toy_config(holds_a_sandbox, sandbox=SandboxSettings()),
                              api_keys=[api_key]))
    answer = post(server, api_key, env={"seed": 1, "config": {"end": how}},
                  safety={"max_time_s": 2})
    assert answer.status_code == status, answer.text
    box = ids[-1]
    assert sandbox_processes(box) == [] and held(backend) == []
    assert live_sandboxes() == 0


def test_a_rollout_whose_client_leaves_ends_its_sandbox(serve, api_key, backend):
    server = serve(create_app(toy_config(holds_a_sandbox), api_keys=[api_key]))
    with pytest.raises(httpx.ReadTimeout):
        body = {"run_id": "gone", "env": {"seed": 1, "config": {"end": "hang"}},
                "mode": "eval",
                "policy": {"config": {"model": "m", "inference_url": "http://127.0.0.1:9/v1"}}}
        httpx.post(server.url + "/rollout", json=body, headers={"X-API-Key": api_key},
                   timeout=httpx.Timeout(30, read=1.5))
    box = ids[-1]
    wait_for(lambda: not sandbox_processes(box) and not held(backend), timeout_s=20,
             what="the sandbox of a rollout whose client left to end")


def test_the_ledger_counts_sandbox_time(serve, api_key, backend):
    server = serve(create_app(toy_config(holds_a_sandbox), api_keys=[api_key]))
    ledger = post(server, api_key).json()["metrics"]["details"]["ledger"]
    assert ledger["sandbox_s"] > 0
    assert ledger["env_s"] >= ledger["sandbox_s"]


def test_a_durable_rollout_that_loses_its_lease_ends_its_sandbox(serve, api_key, backend):
    # synth-containers' async rollouts: one nobody asks after is cancelled when its lease
    # ends, and its sandbox with it.
    server = serve(create_app(toy_config(holds_a_sandbox), api_keys=[api_key]))
    before = len(ids)
    with httpx.Client(base_url=server.url + "/containers", timeout=30,
                      headers={"X-API-Key": api_key}) as c:
        assert c.post("/rollouts", json={
            "rollout_id": "leased", "seed": 1, "submission_mode": "async",
            "lease_ttl_seconds": 1.0, "env": {"config": {"end": "hang"}},
            "policy": {"model": "m", "inference_url": "http://127.0.0.1:9/v1"}}
        ).status_code == 202
        box = wait_for(lambda: ids[before:] and ids[-1], what="the rollout's sandbox")
        wait_for(lambda: sandbox_processes(box), what="its command running")
        wait_for(lambda: not sandbox_processes(box) and not held(backend), timeout_s=20,
                 what="the sandbox of a rollout whose lease ended to end")
        document = c.get("/rollouts/leased").json()
    assert document["status"] == "cancelled" and document["error"]["code"] == "lease_expired"
