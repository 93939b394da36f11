"""The session's reward as stored: the same number in the session row (what `ls`, `stats`
and every filter read) and in its outcome rewards, whichever way the rollout reported it."""

from __future__ import annotations

import sqlite3

from sessions import make_session

from synth_deploy.tracing import SessionTracer, open_trace_store


def stored_rewards(path, session_id: str) -> tuple[float | None, list[float]]:
    with sqlite3.connect(path) as conn:
        (row,) = conn.execute("SELECT total_reward FROM session_traces WHERE session_id = ?",
                              (session_id,)).fetchall()
        outcomes = [r for (r,) in conn.execute(
            "SELECT total_reward FROM outcome_rewards WHERE session_id = ? ORDER BY id",
            (session_id,))]
    return row[0], outcomes


def test_an_outcome_reward_is_stored_in_both_tables(tmp_path):
    path = tmp_path / "t.db"
    session = make_session(3, reward=0.75)
    with open_trace_store(str(path)) as store:
        store.write_session_sync(session)
        listed = store.list_sessions(min_reward=0.5)
    assert stored_rewards(path, session.session_id) == (0.75, [0.75])
    assert [(s.session_id, s.total_reward) for s in listed] == [(session.session_id, 0.75)]


def test_a_reward_reported_only_in_metrics_is_the_session_rows(tmp_path):
    path = tmp_path / "t.db"
    tracer = SessionTracer(metadata={"app_id": "math", "run_id": "r", "status": "ok",
                                     "metrics": {"outcome_reward": 0.25}})
    session = tracer.finish()
    with open_trace_store(str(path)) as store:
        store.write_session_sync(session)
    assert stored_rewards(path, session.session_id) == (0.25, [])


def test_the_last_outcome_reward_is_the_sessions(tmp_path):
    path = tmp_path / "t.db"
    tracer = SessionTracer(metadata={"app_id": "math", "run_id": "r", "status": "ok"})
    tracer.record_outcome_reward(0.5)
    tracer.record_outcome_reward(0.9)
    session = tracer.finish()
    with open_trace_store(str(path)) as store:
        store.write_session_sync(session)
    assert stored_rewards(path, session.session_id) == (0.9, [0.5, 0.9])
