"""The session's reward as stored: the same number in the session row (what `ls`, `stats`
and every filter read) and in its outcome rewards, whichever way the rollout reported it."""

from __future__ import annotations

import sqlite3

from sessions import make_session

from synth_deploy.tracing import SCHEMA_VERSION, SessionTracer, open_trace_store


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


def test_no_sql_rewrites_the_reward_the_store_wrote(tmp_path):
    # The store owns the session row's reward (`session_reward`, written with the outcome
    # rows): a trigger that copied each new outcome row into it also hid a wrong one.
    path = tmp_path / "t.db"
    session = make_session(3, reward=0.75)
    with open_trace_store(str(path)) as store:
        store.write_session_sync(session)
    with sqlite3.connect(path) as conn:
        triggers = {name for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger'")}
        assert triggers and "synth_deploy_outcome_added" not in triggers
        conn.execute("INSERT INTO outcome_rewards (session_id, total_reward, achievements_"
                     "count, total_steps, created_at) VALUES (?, 0.0, 0, 0, 'now')",
                     (session.session_id,))
    assert stored_rewards(path, session.session_id) == (0.75, [0.75, 0.0])


# What version 9 created (and versions 3 to 8): the trigger version 10 drops.
_V9_OUTCOME_TRIGGER = """CREATE TRIGGER synth_deploy_outcome_added AFTER INSERT ON
    outcome_rewards BEGIN UPDATE session_traces SET total_reward = NEW.total_reward
    WHERE session_id = NEW.session_id AND total_reward IS NOT NEW.total_reward; END"""


def test_a_version_9_file_loses_the_outcome_trigger_and_reads_the_same(tmp_path):
    path = tmp_path / "old.db"
    sessions = [make_session(i, reward=i / 4) for i in range(3)]
    with open_trace_store(str(path)) as store:
        store.write_sessions_sync(sessions)
    with sqlite3.connect(path) as conn:  # as version 9 left it
        conn.execute(_V9_OUTCOME_TRIGGER)
        conn.execute("DELETE FROM synth_deploy_schema WHERE version >= 10")
        conn.execute("DROP TABLE session_journal")
    with open_trace_store(str(path), read_only=True) as store:  # read as it is
        assert store.schema_version == 9
        before = [(s.session_id, s.total_reward) for s in store.list_sessions(limit=None)]
    assert sorted(r for _, r in before) == [0.0, 0.25, 0.5]
    with open_trace_store(str(path)) as store:
        assert store.schema_version == SCHEMA_VERSION
        assert [(s.session_id, s.total_reward) for s in store.list_sessions(limit=None)] \
            == before
        late = make_session(7, reward=0.5)
        store.write_session_sync(late)
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM sqlite_master WHERE name = "
                            "'synth_deploy_outcome_added'").fetchone() == (0,)
    assert stored_rewards(path, late.session_id) == (0.5, [0.5])
