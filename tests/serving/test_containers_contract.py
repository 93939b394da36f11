"""synth-containers' contract under /containers: real servers on loopback, real trace files.

What Synth's optimizers drive (metadata, dataset, rows, sync and async rollouts), and what
makes an async rollout durable: its id, its lease, its record in the trace store.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from toy_apps import toy_config

from synth_deploy.serving import RolloutLimits, create_app
from synth_deploy.taskapp import RolloutContext, RolloutRequest, TaskDataset
from synth_deploy.tracing import RolloutRecords, open_trace_store


def sleeping(seconds: float):
    async def rollout(request: RolloutRequest, ctx: RolloutContext) -> dict:
        await asyncio.sleep(float(request.env.config.get("sleep", seconds)))
        ctx.tracer.record_outcome_reward((request.env.seed or 0) / 10)
        return {"run_id": request.run_id, "metrics": {}}
    return rollout


def body(rollout_id: str, seed: int = 3, mode: str = "async", **env_config) -> dict:
    return {"rollout_id": rollout_id, "seed": seed, "submission_mode": mode,
            "env": {"config": env_config},
            "policy": {"model": "m", "inference_url": "http://127.0.0.1:9/v1"}}


def client(app, api_key: str) -> httpx.Client:
    return httpx.Client(base_url=app.url + "/containers", timeout=30,
                        headers={"X-API-Key": api_key})


def wait_done(c: httpx.Client, rollout_id: str, timeout_s: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        doc = c.get(f"/rollouts/{rollout_id}").json()
        if doc["status"] != "running":
            return doc
        time.sleep(0.05)
    raise AssertionError(f"rollout {rollout_id} still running after {timeout_s}s")


def test_metadata_dataset_rows_and_program_under_the_key_rule(serve, api_key):
    config = toy_config()
    config.dataset_registry.register(TaskDataset(id="toy", splits=("train",),
                                                 seeds=range(0, 20)))
    app = serve(create_app(config, api_keys=[api_key]))
    assert httpx.get(app.url + "/containers/metadata").status_code == 401
    with client(app, api_key) as c:
        meta = c.get("/metadata").json()
        assert meta["capabilities"]["protocol"] == "synth.container.contract.v1"
        assert "async" in meta["capabilities"]["rollout_modes"]
        assert meta["capabilities"]["async_rollouts"]["durable"] is False  # no store
        assert c.get("/dataset").json()["splits"] == [{"name": "train", "count": 20}]
        rows = c.post("/dataset/rows", json={"seeds": [1, 2]}).json()["rows"]
        assert [r["seed"] for r in rows] == [1, 2]
        assert rows[0]["task_info"]["task_metadata"]["seed"] == 1
        unknown = c.post("/dataset/rows", json={"seeds": [99]})
        assert unknown.status_code == 404
        assert "none of this app's datasets" in unknown.json()["detail"]["error"]["message"]
        bad = c.post("/dataset/rows", json={"seeds": "1"})
        assert bad.status_code == 422
        assert bad.json()["detail"]["error"]["errors"][0]["path"] == "seeds"
        assert c.get("/program").status_code == 404


def test_a_sync_rollout_is_answered_done_and_traced(tmp_path, serve, api_key):
    with open_trace_store(str(tmp_path / "t.db")) as store:
        app = serve(create_app(toy_config(), api_keys=[api_key], trace_store=store,
                               rollout_records=RolloutRecords(store)))
        with client(app, api_key) as c:
            resp = c.post("/rollouts", json=body("s-1", seed=4, mode="sync"))
        assert resp.status_code == 200, resp.text
        doc = resp.json()
        assert doc["status"] == "completed" and doc["success_status"] == "success"
        assert doc["reward_info"]["outcome_reward"] == 0.4
        assert doc["response"]["run_id"] == "s-1"
        [session] = store.list_sessions(limit=None)
        assert session.run_id == "s-1" and session.status == "ok"


def test_an_async_rollout_202_state_events_stream_and_result(tmp_path, serve, api_key):
    with open_trace_store(str(tmp_path / "t.db")) as store:
        app = serve(create_app(toy_config(sleeping(1.0)), api_keys=[api_key],
                               trace_store=store, rollout_records=RolloutRecords(store),
                               limits=RolloutLimits(head_after_s=1, heartbeat_s=0.2)))
        with client(app, api_key) as c:
            submitted = c.post("/rollouts", json=body("a-1"))
            assert submitted.status_code == 202
            assert submitted.json()["status"] == "running"
            assert c.get("/rollouts/a-1/state").json()["status"] == "running"
            with c.stream("GET", "/rollouts/a-1/stream") as stream:
                assert stream.headers["content-type"].startswith("text/event-stream")
                assert stream.headers["x-accel-buffering"] == "no"
                text = "".join(stream.iter_text())
            assert ": heartbeat" in text  # a silent second still sends bytes
            assert "event: rollout.accepted" in text and "event: rollout.completed" in text
            doc = c.get("/rollouts/a-1").json()
            events = c.get("/rollouts/a-1/events", params={"after": 1}).json()
        assert doc["status"] == "completed" and doc["summary"]["reward"] == 0.3
        assert [e["kind"] for e in events["events"]] == ["rollout.completed"]
        assert events["cursor"]["closed"] is True
        assert [s.run_id for s in store.list_sessions(limit=None)] == ["a-1"]


def test_the_same_id_replays_and_another_body_under_it_is_a_409(serve, api_key):
    app = serve(create_app(toy_config(sleeping(0.5)), api_keys=[api_key]))
    with client(app, api_key) as c:
        assert c.post("/rollouts", json=body("r-1")).status_code == 202
        running_again = c.post("/rollouts", json=body("r-1"))
        assert running_again.json()["replayed"] is True
        conflict = c.post("/rollouts", json=body("r-1", seed=5))
        assert conflict.status_code == 409
        # The contract's shape: clients match detail.error as the string.
        assert conflict.json()["detail"]["error"] == "rollout_identity_conflict"
        assert conflict.json()["detail"]["rollout_id"] == "r-1"
        first = wait_done(c, "r-1")
        # Asked again once done (sync this time): the first run's result, not a second run.
        replay = c.post("/rollouts", json=body("r-1", mode="sync"))
    assert replay.status_code == 200 and replay.json()["replayed"] is True
    assert replay.json()["reward_info"] == first["reward_info"]
    assert replay.json()["updated_at"] == first["updated_at"]


def test_async_rollouts_are_admitted_like_sync_ones(serve, api_key):
    app = serve(create_app(toy_config(sleeping(1.0)), api_keys=[api_key],
                           limits=RolloutLimits(max_in_flight=1)))
    with client(app, api_key) as c:
        assert c.post("/rollouts", json=body("c-1")).status_code == 202
        health = httpx.get(app.url + "/health", headers={"X-API-Key": api_key}).json()
        assert health["rollouts"]["in_flight"] == 1
        refused = c.post("/rollouts", json=body("c-2"))
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        sync_refused = httpx.post(app.url + "/rollout", headers={"X-API-Key": api_key},
                                  json={"run_id": "x", "env": {"seed": 1}})
        assert sync_refused.status_code == 503
        wait_done(c, "c-1")
        assert c.post("/rollouts", json=body("c-2")).status_code == 202


def test_a_rollout_nobody_asks_after_is_cancelled_when_its_lease_ends(tmp_path, serve, api_key):
    with open_trace_store(str(tmp_path / "t.db")) as store:
        app = serve(create_app(toy_config(sleeping(30.0)), api_keys=[api_key],
                               trace_store=store, rollout_records=RolloutRecords(store)))
        with client(app, api_key) as c:
            assert c.post("/rollouts", json={**body("l-1"), "lease_ttl_seconds": 0.5}
                          ).status_code == 202
            # Nobody asks: the lease ends, the sweep cancels it and its session is stored.
            # Waited for in the store, which asking the server would not be (it renews).
            deadline = time.monotonic() + 15
            while store.count_sessions() == 0:
                assert time.monotonic() < deadline, "the lease never ended the rollout"
                time.sleep(0.05)
            doc = wait_done(c, "l-1")  # its outcome is final: asking now renews nothing
        assert doc["status"] == "cancelled" and doc["error"]["code"] == "lease_expired"
        [session] = store.list_sessions(limit=None)
        assert session.run_id == "l-1" and session.status == "cancelled"


def test_polling_holds_the_lease(serve, api_key):
    app = serve(create_app(toy_config(sleeping(1.5)), api_keys=[api_key]))
    with client(app, api_key) as c:
        c.post("/rollouts", json={**body("p-1"), "lease_ttl_seconds": 0.5})
        doc = wait_done(c, "p-1")  # polls every 50 ms: well inside the lease
    assert doc["status"] == "completed"


def test_a_restarted_client_reads_the_result_and_a_restarted_server_says_interrupted(
        tmp_path, serve, api_key):
    from synth_deploy.serving import BackgroundServer

    path = str(tmp_path / "t.db")
    with open_trace_store(path) as store:
        first = BackgroundServer(create_app(toy_config(sleeping(0.3)), api_keys=[api_key],
                                            trace_store=store,
                                            rollout_records=RolloutRecords(store))).start()
        try:
            with client(first, api_key) as c:
                c.post("/rollouts", json=body("done-1", sleep=0.1))
                c.post("/rollouts", json=body("lost-1", sleep=60))
                wait_done(c, "done-1")
        finally:
            first.stop()  # mid-rollout for lost-1
    with open_trace_store(path) as store:
        second = serve(create_app(toy_config(), api_keys=[api_key], trace_store=store,
                                  rollout_records=RolloutRecords(store)))
        with client(second, api_key) as c:  # a new client, a new server: the same store
            assert c.get("/metadata").json()["capabilities"]["async_rollouts"]["durable"]
            done = c.get("/rollouts/done-1").json()
            lost = c.get("/rollouts/lost-1")
            replayed = c.post("/rollouts", json=body("done-1", sleep=0.1))
            unknown = c.get("/rollouts/never")
    assert done["status"] == "completed" and done["reward_info"]["outcome_reward"] == 0.3
    assert lost.status_code == 200 and lost.json()["status"] == "interrupted"
    assert replayed.json()["replayed"] is True
    assert unknown.status_code == 404


@pytest.mark.parametrize("bad, path", [
    ({"rollout_id": "has space"}, "rollout_id"),
    ({"rollout_id": "ok", "submission_mode": "later"}, "submission_mode"),
    ({"rollout_id": "ok", "seed": "three"}, "env.seed"),
    ({"rollout_id": "ok", "lease_ttl_seconds": -1}, "lease_ttl_seconds"),
])
def test_bad_submissions_name_the_field(serve, api_key, bad, path):
    app = serve(create_app(toy_config(), api_keys=[api_key]))
    with client(app, api_key) as c:
        resp = c.post("/rollouts", json=bad)
    assert resp.status_code == 422
    assert resp.json()["detail"]["error"]["errors"][0]["path"] == path


def test_a_store_that_refuses_writes_refuses_the_submission_and_says_why(tmp_path, serve,
                                                                         api_key):
    store = open_trace_store(str(tmp_path / "t.db"))
    store.close()
    app = serve(create_app(toy_config(), api_keys=[api_key], trace_store=store,
                           rollout_records=RolloutRecords(store)))
    with client(app, api_key) as c:
        resp = c.post("/rollouts", json=body("w-1"))
        health = httpx.get(app.url + "/health", headers={"X-API-Key": api_key}).json()
    assert resp.status_code == 500
    assert resp.json()["detail"]["error"]["code"] == "record_write_failed"
    assert health["rollouts"]["in_flight"] == 0  # nothing left counted


def test_a_client_waiting_on_a_sync_rollout_holds_its_lease(serve, api_key):
    app = serve(create_app(toy_config(sleeping(1.5)), api_keys=[api_key]))
    with client(app, api_key) as c:
        resp = c.post("/rollouts", json={**body("h-1", mode="sync"), "lease_ttl_seconds": 0.4})
    assert resp.status_code == 200 and resp.json()["status"] == "completed"


def test_terminate_cancels_a_running_rollout_and_traces_it(tmp_path, serve, api_key):
    with open_trace_store(str(tmp_path / "t.db")) as store:
        app = serve(create_app(toy_config(sleeping(30.0)), api_keys=[api_key],
                               trace_store=store, rollout_records=RolloutRecords(store)))
        with client(app, api_key) as c:
            c.post("/rollouts", json=body("t-1"))
            c.post("/rollouts/t-1/terminate")
            doc = wait_done(c, "t-1")
            health = httpx.get(app.url + "/health", headers={"X-API-Key": api_key}).json()
        assert doc["status"] == "cancelled" and doc["error"]["code"] == "terminated"
        assert health["rollouts"]["in_flight"] == 0
        [session] = store.list_sessions(limit=None)
        assert session.run_id == "t-1" and session.status == "cancelled"


def test_a_long_poll_is_answered_as_soon_as_the_rollout_ends(serve, api_key):
    app = serve(create_app(toy_config(sleeping(1.0)), api_keys=[api_key]))
    with client(app, api_key) as c:
        c.post("/rollouts", json=body("lp-1"))
        asked = time.monotonic()
        doc = c.get("/rollouts/lp-1", params={"wait_ms": 8000}).json()
        waited = time.monotonic() - asked
        quick = c.get("/rollouts/lp-1", params={"wait_ms": 8000})  # done: no wait at all
    assert doc["status"] == "completed" and 0.5 < waited < 4.0
    assert quick.elapsed.total_seconds() < 1.0
