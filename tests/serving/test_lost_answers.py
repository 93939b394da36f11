"""A rollout is stored as what its client got: one whose answer never reached the client
(the connection cut after the early head, while the trace was being stored) is not counted
``ok`` by stats or exports. Real uvicorn, the Cloudflare edge stand-in, a real trace file
whose commit the test holds back with a write lock of its own."""

from __future__ import annotations

import json
import socket
import sqlite3
import threading
import time

import httpx
import pytest
from standins.cutoff_proxies import EdgeProxy
from toy_apps import toy_config

from synth_deploy.serving import RolloutLimits, create_app
from synth_deploy.tracing import open_trace_store

SILENCE_S = 1.0  # the edge's silence limit, scaled; the server's heartbeat is longer


def in_flight(server, api_key) -> int:
    return httpx.get(server.url + "/health", headers={"X-API-Key": api_key},
                     timeout=5).json()["rollouts"]["in_flight"]


def test_an_answer_cut_after_its_head_is_not_stored_ok(tmp_path, serve, api_key):
    finish = threading.Event()

    def rollout(request, ctx):  # runs on a worker thread until the test lets it end
        assert finish.wait(10)
        return {"metrics": {"episode_rewards": [1.0]}}

    db = tmp_path / "traces.db"
    with open_trace_store(str(db)) as store:
        app = create_app(toy_config(rollout), api_keys=[api_key], trace_store=store,
                         limits=RolloutLimits(head_after_s=0.2, heartbeat_s=60))
        server = serve(app)
        body = json.dumps({"run_id": "cut", "env": {"seed": 1},
                           "policy": {"config": {"model": "m"}}})
        lock = sqlite3.connect(db, isolation_level=None)
        with EdgeProxy(server.url, silence_s=SILENCE_S) as edge:
            with httpx.stream("POST", edge.url + "/rollout", content=body, timeout=10,
                              headers={"X-API-Key": api_key,
                                       "content-type": "application/json"}) as resp:
                assert resp.status_code == 200  # the early head
                lock.execute("BEGIN IMMEDIATE")  # the rollout's trace waits for this
                finish.set()
                with pytest.raises(httpx.TransportError):
                    resp.read()  # the edge hears nothing for SILENCE_S and cuts
            assert edge.cut == 1
            # The edge closed its side to the server before the client's; nothing outside
            # the server shows when it has read that close.
            time.sleep(0.5)
            lock.execute("COMMIT")
            deadline = time.monotonic() + 10
            while in_flight(server, api_key):  # its slot is held until it is recorded
                assert time.monotonic() < deadline, "the rollout never finished"
                time.sleep(0.02)
        lock.close()
        [summary] = store.list_sessions()
        metadata = store.get_session(summary.session_id).metadata
        assert metadata["metrics"]["episode_rewards"] == [1.0]  # it ran to the end
        assert summary.status == "error", "stored ok, though its client never got the answer"
        assert metadata["error"]["code"] == "client_disconnected"
        stats = store.stats()
        assert (stats.ok, stats.errors) == (0, 1)
        assert store.count_sessions(status="ok") == 0


def test_an_answer_that_arrived_is_stored_ok(tmp_path, serve, api_key):
    """The same rollout through the same edge, its head early, its client there to the end."""

    def rollout(request, ctx):
        time.sleep(0.5)
        return {"metrics": {"episode_rewards": [1.0]}}

    with open_trace_store(str(tmp_path / "traces.db")) as store:
        app = create_app(toy_config(rollout), api_keys=[api_key], trace_store=store,
                         limits=RolloutLimits(head_after_s=0.2, heartbeat_s=60))
        server = serve(app)
        with EdgeProxy(server.url, silence_s=SILENCE_S) as edge:
            resp = httpx.post(edge.url + "/rollout", timeout=10, content=json.dumps(
                {"run_id": "kept", "env": {"seed": 1}, "policy": {"config": {"model": "m"}}}),
                headers={"X-API-Key": api_key, "content-type": "application/json"})
        assert resp.status_code == 200 and resp.json()["run_id"] == "kept"
        [summary] = store.list_sessions()
        assert summary.status == "ok"
        assert store.stats().ok == 1


class AckLost:
    """The kit's store whose writer commits each session and then dies before saying so
    (a writer child killed between its commit and its acknowledgement)."""

    def __init__(self, store):
        self.store = store

    def start(self):
        self.store.start()

    async def write_session(self, session, rollout=None):
        from synth_deploy.errors import TraceStoreError

        await self.store.write_session(session, rollout)
        raise TraceStoreError("the trace writer process exited before committing")

    async def record_lost_answer(self, session_id, error):
        await self.store.record_lost_answer(session_id, error)


@pytest.mark.parametrize("head_after_s", [0.2, 30.0])
def test_a_rollout_answered_trace_write_failed_is_not_stored_ok(tmp_path, serve, api_key,
                                                                 head_after_s):
    def rollout(request, ctx):
        time.sleep(0.4)
        return {"metrics": {"episode_rewards": [1.0]}}

    with open_trace_store(str(tmp_path / "traces.db")) as store:
        app = create_app(toy_config(rollout), api_keys=[api_key], trace_store=AckLost(store),
                         limits=RolloutLimits(head_after_s=head_after_s, heartbeat_s=60))
        server = serve(app)
        resp = httpx.post(server.url + "/rollout", timeout=10, content=json.dumps(
            {"run_id": "unacked", "env": {"seed": 1}, "policy": {"config": {"model": "m"}}}),
            headers={"X-API-Key": api_key, "content-type": "application/json"})
        # After an early head the status is in the body.
        assert resp.status_code == (200 if head_after_s < 0.4 else 500)
        assert resp.json()["detail"]["error"]["code"] == "trace_write_failed"
        deadline = time.monotonic() + 10
        while in_flight(server, api_key):
            assert time.monotonic() < deadline, "the rollout never finished"
            time.sleep(0.02)
        [summary] = store.list_sessions()
        assert summary.status == "error"
        assert store.get_session(summary.session_id).metadata["error"]["code"] == \
            "trace_write_failed"
        assert store.stats().ok == 0


def test_a_short_rollout_whose_client_left_is_not_stored_ok(tmp_path, serve, api_key):
    """A rollout shorter than the interval at which a listener starts: its client leaves
    while it runs, and nothing but the answer's moment tells the server so."""
    started = threading.Event()

    def rollout(request, ctx):
        started.set()
        time.sleep(0.5)
        return {"metrics": {"episode_rewards": [1.0]}}

    with open_trace_store(str(tmp_path / "traces.db")) as store:
        app = create_app(toy_config(rollout), api_keys=[api_key], trace_store=store,
                         limits=RolloutLimits(head_after_s=30, heartbeat_s=60))
        server = serve(app)
        body = json.dumps({"run_id": "gone", "env": {"seed": 1},
                           "policy": {"config": {"model": "m"}}}).encode()
        host, port = server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as client:
            client.sendall(b"POST /rollout HTTP/1.1\r\nhost: x\r\ncontent-type: "
                           b"application/json\r\nx-api-key: " + api_key.encode() +
                           b"\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" +
                           body)
            assert started.wait(5)
        deadline = time.monotonic() + 10
        while in_flight(server, api_key) or not store.count_sessions():
            assert time.monotonic() < deadline, "the rollout never finished"
            time.sleep(0.02)
        deadline = time.monotonic() + 5
        while store.count_sessions(status="ok") and time.monotonic() < deadline:
            time.sleep(0.02)  # the correction follows the answer's moment
        [summary] = store.list_sessions()
        assert summary.status == "error", "stored ok, though its client had left"
        assert store.get_session(summary.session_id).metadata["error"]["code"] == \
            "client_disconnected"
