"""Async rollouts' records in the trace store: a table of their own, claims that never
overwrite, and a record that outlives the process that wrote it."""

from __future__ import annotations

from synth_deploy.tracing import (
    RolloutClaim,
    RolloutFinish,
    RolloutRecords,
    open_trace_store,
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
