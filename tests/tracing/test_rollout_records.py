"""Async rollouts' records in the trace store: a table of their own, claims that never
overwrite, and a record that outlives the process that wrote it."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import httpx
from toy_apps import toy_config

from synth_deploy.serving import BackgroundServer, create_app
from synth_deploy.tracing import (
    RolloutClaim,
    RolloutFinish,
    RolloutRecords,
    open_trace_store,
    utc_text,
)


def test_claims_finishes_and_a_record_another_owner_left_running(tmp_path):
    path = str(tmp_path / "t.db")
    with open_trace_store(path) as store:
        records = RolloutRecords(store)
        found = records.apply([RolloutClaim("a", "d1", "owner-1", 1.0),
                               RolloutClaim("b", "d2", "owner-1", 1.0)], [])
        assert found == {}
        # Claimed again (another body, another owner): the first record answers, unchanged.
        again = records.apply([RolloutClaim("a", "other", "owner-2", 2.0)],
                              [RolloutFinish("b", "completed", {"status": "completed"}, 3.0)])
        assert again["a"].digest == "d1" and again["a"].owner == "owner-1"
        assert store.count_sessions() == 0  # the session tables are not touched
    with open_trace_store(path) as store:  # another process, later
        records = RolloutRecords(store)
        a, b = records.get("a"), records.get("b")
        assert a.status == "running" and a.lost_by("owner-2") and not a.lost_by("owner-1")
        assert b.status == "completed" and b.result == {"status": "completed"}
        assert records.get("never") is None


def test_a_records_times_are_given_with_their_zone(tmp_path):
    with open_trace_store(str(tmp_path / "t.db")) as store:
        records = RolloutRecords(store)
        records.apply([RolloutClaim("a", "d1", "owner-1", 1_796_000_000.25)], [])
        record = records.get("a")
    assert record.created_at == record.updated_at == "2026-11-30T00:53:20.250000+00:00"
    assert record.created_at == utc_text(1_796_000_000.25)


def test_a_rollouts_times_read_from_the_store_are_those_it_gave_live(tmp_path, api_key):
    # synth-containers' documents: a server that restarted answers from the store what
    # the first answered live, character for character.
    path = str(tmp_path / "t.db")
    with open_trace_store(path) as store:
        first = BackgroundServer(create_app(toy_config(_sleeping), api_keys=[api_key],
                                            trace_store=store,
                                            rollout_records=RolloutRecords(store))).start()
        try:
            with _client(first, api_key) as c:
                c.post("/rollouts", json=_body("lost-1"))
                live = c.get("/rollouts/lost-1").json()
        finally:
            first.stop()  # mid-rollout
    with open_trace_store(path) as store:
        second = BackgroundServer(create_app(toy_config(_sleeping), api_keys=[api_key],
                                             trace_store=store,
                                             rollout_records=RolloutRecords(store))).start()
        try:
            with _client(second, api_key) as c:
                stored = c.get("/rollouts/lost-1").json()
        finally:
            second.stop()
    assert live["status"] == "running" and stored["status"] == "interrupted"
    assert stored["created_at"] == live["created_at"]
    assert datetime.fromisoformat(stored["created_at"]).utcoffset() == timedelta(0)
    assert datetime.fromisoformat(stored["updated_at"]).utcoffset() == timedelta(0)


async def _sleeping(request, ctx):
    await asyncio.sleep(60)
    return {"run_id": request.run_id, "metrics": {}}


def _body(rollout_id: str) -> dict:
    return {"rollout_id": rollout_id, "seed": 1, "submission_mode": "async", "env": {},
            "policy": {"model": "m", "inference_url": "http://127.0.0.1:9/v1"}}


def _client(server, api_key: str) -> httpx.Client:
    return httpx.Client(base_url=server.url + "/containers", timeout=30,
                        headers={"X-API-Key": api_key})
