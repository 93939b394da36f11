"""Async rollouts' records in the trace store: keyed by app and id, claims that never
overwrite (one winner among servers), a runner's heartbeat, asks that reach the runner, a
bounded table, and a store of the old layout upgraded."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import datetime, timedelta

import httpx
from toy_apps import toy_config

from synth_deploy.serving import BackgroundServer, create_app
from synth_deploy.tracing import (
    RECORD_KEPT_S,
    RUNNER_LOST_S,
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
        found = records.apply("app", "owner-1", [RolloutClaim("a", "d1", "owner-1", 1.0),
                                                 RolloutClaim("b", "d2", "owner-1", 1.0)], [],
                              1.0)
        assert found == {}
        # Claimed again (another body, another owner): the first record answers, unchanged.
        again = records.apply("app", "owner-2", [RolloutClaim("a", "other", "owner-2", 2.0)],
                              [], 2.0)
        records.apply("app", "owner-1", [],
                      [RolloutFinish("b", "completed", {"status": "completed"}, 3.0)], 3.0)
        assert again["a"].digest == "d1" and again["a"].owner == "owner-1"
        assert store.count_sessions() == 0  # the session tables are not touched
    with open_trace_store(path) as store:  # another process, later
        records = RolloutRecords(store)
        a, b = records.get("app", "a"), records.get("app", "b")
        assert a.status == "running" and a.runner_seen == 3.0
        # Its runner beat at 3.0: alive until RUNNER_LOST_S later, then lost; never to itself.
        assert not a.lost("owner-2", 3.0 + RUNNER_LOST_S)
        assert a.lost("owner-2", 3.1 + RUNNER_LOST_S) and not a.lost("owner-1", 1e9)
        assert b.status == "completed" and b.result == {"status": "completed"}
        assert records.get("app", "never") is None


def test_two_apps_on_one_store_never_see_each_others_ids(tmp_path):
    with open_trace_store(str(tmp_path / "t.db")) as store:
        records = RolloutRecords(store)
        assert records.apply("math", "o1", [RolloutClaim("r-1", "dm", "o1", 1.0)], [], 1.0) == {}
        assert records.apply("rel", "o2", [RolloutClaim("r-1", "dr", "o2", 1.0)], [], 1.0) == {}
        records.apply("math", "o1", [], [RolloutFinish("r-1", "completed", {"app": "math"},
                                                       2.0)], 2.0)
        assert records.get("math", "r-1").result == {"app": "math"}
        assert records.get("rel", "r-1").digest == "dr"
        assert records.get("rel", "r-1").status == "running"


def test_touches_and_stops_reach_the_runner(tmp_path):
    with open_trace_store(str(tmp_path / "t.db")) as store:
        records = RolloutRecords(store)
        records.apply("app", "runner", [RolloutClaim("a", "d", "runner", 1.0, 5.0),
                                        RolloutClaim("b", "d", "runner", 1.0, 5.0)], [], 1.0)
        records.touch("app", "a", 4.0, 30.0)  # asked after on another server
        records.request_stop("app", "b", "terminated")
        news = records.news("app", "runner", ["a"], 5.0)
        assert news.stops == {"b": "terminated"} and news.touched == {"a": (4.0, 30.0)}
        assert records.get("app", "a").runner_seen == 5.0
        records.apply("app", "runner", [], [RolloutFinish("b", "cancelled", {}, 6.0)], 6.0)
        assert records.news("app", "runner", [], 7.0).stops == {}  # answered: asked no more
        records.request_stop("app", "b", "terminated")  # a finished one is not asked again
        assert records.get("app", "b").stop is None


def test_finished_records_are_pruned_past_their_retention(tmp_path):
    with open_trace_store(str(tmp_path / "t.db")) as store:
        records = RolloutRecords(store)
        claims = [RolloutClaim(f"r{i}", "d", "o", float(i)) for i in range(6)]
        records.apply("app", "o", claims, [RolloutFinish(f"r{i}", "completed", {}, float(i))
                                           for i in range(5)], 5.0)
        records.prune("app", 2.5 + RECORD_KEPT_S)  # r0..r2 finished before the retention
        assert [records.get("app", f"r{i}") is None for i in range(6)] == [
            True, True, True, False, False, False]
        records.kept = 1  # and at most the newest one
        records.prune("app", 10.0)
        assert [records.get("app", f"r{i}") is None for i in range(3, 6)] == [
            True, False, False]  # r5 is running: never pruned while its runner beats


def test_a_store_with_the_old_table_is_upgraded_and_its_records_kept(tmp_path):
    path = tmp_path / "t.db"
    with open_trace_store(str(path)):
        pass
    conn = sqlite3.connect(path)  # a store as version 11 left it, its table made at first use
    conn.execute("DROP TABLE async_rollouts")
    conn.execute("DROP TABLE rollout_runners")
    conn.execute("DELETE FROM synth_deploy_schema WHERE version = 13")
    conn.execute("CREATE TABLE async_rollouts (rollout_id TEXT PRIMARY KEY, digest TEXT NOT "
                 "NULL, status TEXT NOT NULL, owner TEXT NOT NULL, created_at TEXT NOT NULL, "
                 "updated_at TEXT NOT NULL, result TEXT)")
    conn.execute("INSERT INTO async_rollouts VALUES ('old', 'd', 'completed', 'o', "
                 "'2026-01-01 00:00:00', '2026-01-01 00:00:00', '{\"status\": \"completed\"}')")
    conn.commit()
    conn.close()
    with open_trace_store(str(path)) as store:
        records = RolloutRecords(store)
        assert store.schema_version == 13
        assert records.get("", "old").result == {"status": "completed"}
        assert records.get("math", "old") is None  # no app claims a record of unknown app
        assert records.apply("math", "o", [RolloutClaim("old", "d2", "o", 1.0)], [], 1.0) == {}


def test_a_records_times_are_given_with_their_zone(tmp_path):
    with open_trace_store(str(tmp_path / "t.db")) as store:
        records = RolloutRecords(store)
        records.apply("app", "owner-1", [RolloutClaim("a", "d1", "owner-1", 1_796_000_000.25)],
                      [], 1_796_000_000.25)
        record = records.get("app", "a")
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
