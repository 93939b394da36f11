"""A client that gives up on a rollout (closes its connection) gets its admission slot back
within a sweep of the server's, and the rollout is stored as what the client got: stopped,
not a success. Real uvicorn, raw sockets for the clients that leave, a real trace file."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest
from toy_apps import toy_config

from synth_deploy.serving import RolloutLimits, create_app
from synth_deploy.tracing import open_trace_store


async def slow_rollout(request, ctx):
    await asyncio.sleep(request.env.config.get("sleep", 0))
    return {"metrics": {"episode_rewards": [1.0]}}


def sleepy_sync_rollout(request, ctx):
    time.sleep(request.env.config.get("sleep", 0))
    return {"metrics": {"episode_rewards": [1.0]}}


def body(run_id: str, sleep: float) -> bytes:
    return json.dumps({"run_id": run_id, "env": {"seed": 1, "config": {"sleep": sleep}},
                       "policy": {"config": {"model": "m"}}}).encode()


def send_and_leave(url: str, api_key: str, run_id: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    payload = body(run_id, 30)
    sock.sendall(f"POST /rollout HTTP/1.1\r\nHost: {host}\r\nX-API-Key: {api_key}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
                 .encode() + payload)
    return sock


def in_flight(server, api_key) -> int:
    return httpx.get(server.url + "/health", headers={"X-API-Key": api_key},
                     timeout=5).json()["rollouts"]["in_flight"]


@pytest.mark.parametrize("rollout", [slow_rollout, sleepy_sync_rollout])
def test_a_client_that_leaves_gets_its_slot_back_and_is_recorded(tmp_path, serve, api_key,
                                                                  rollout):
    with open_trace_store(str(tmp_path / "traces.db")) as store:
        app = create_app(toy_config(rollout), api_keys=[api_key], trace_store=store,
                         limits=RolloutLimits(max_in_flight=2, head_after_s=4,
                                              heartbeat_s=1))  # a sweep each 0.25 s
        server = serve(app)
        socks = [send_and_leave(server.url, api_key, f"gone-{i}") for i in range(2)]
        deadline = time.monotonic() + 5
        while in_flight(server, api_key) < 2:
            assert time.monotonic() < deadline, "the rollouts never started"
            time.sleep(0.02)
        for sock in socks:
            sock.close()
        deadline = time.monotonic() + 5
        while in_flight(server, api_key) > 0:
            assert time.monotonic() < deadline, "the abandoned rollouts kept their slots"
            time.sleep(0.02)
        resp = httpx.post(server.url + "/rollout", content=body("stays", 0), timeout=10,
                          headers={"X-API-Key": api_key, "content-type": "application/json"})
        assert resp.status_code == 200, resp.text
        stored = {s.run_id: s for s in store.list_sessions(limit=None)}
        assert set(stored) == {"gone-0", "gone-1", "stays"}
        assert stored["stays"].status == "ok"
        for run_id in ("gone-0", "gone-1"):
            error = store.get_session(stored[run_id].session_id).metadata["error"]
            assert stored[run_id].status == "error" and error["code"] == "client_disconnected"
            # Who failed: the client, and the same request sent again may succeed.
            assert (error["kind"], error["retryable"]) == ("client", True)
        assert "2 errors" in app.state.stats.summary(10.0)
