"""Each message stored once per session: a long episode's rows grow with its turns, and every
reader (the store's sessions, `traces show`, the SFT export, synth-ai's filter) reads back the
whole conversation each call saw. Real servers, the real mock policy, real SQLite files."""

from __future__ import annotations

import json
import sqlite3

import httpx
import pytest
from sessions import assert_same

from synth_deploy.serving import create_app
from synth_deploy.taskapp import Step, TaskApp, function_tool
from synth_deploy.tracing import export_sft, open_trace_store, parse_trace_db, sft_examples


class Corridor:
    tool = function_tool("walk", "Walk on.", {"type": "object", "properties": {}})

    def reset(self, seed, *, episode_id, config):
        self.at = 0
        return {"text": "You stand at cell 0 of a long corridor."}

    def step(self, action):
        self.at += 1
        return Step({"text": f"You stand at cell {self.at} of a long corridor."}, reward=0.5)


@pytest.fixture
def traced(serve, api_key, tmp_path):
    def start(history_turns=None):
        db = tmp_path / f"traces-{history_turns}.db"
        store = open_trace_store(parse_trace_db(str(db)))
        env = type("Windowed", (Corridor,), {"history_turns": history_turns}) \
            if history_turns else Corridor
        task_app = TaskApp(f"corridor-{history_turns}", name="Corridor", description="Walk.")
        task_app.environment(env)
        server = serve(create_app(task_app.build_config(), api_keys=[api_key],
                                  trace_store=store))
        opened.append(store)
        return server, db

    opened: list = []
    yield start
    for store in opened:
        store.close()


def play(server, api_key, policy_url, turns, run_id):
    resp = httpx.post(server.url + "/rollout", headers={"X-API-Key": api_key}, timeout=60,
                      json={"run_id": run_id, "env": {"seed": 0, "config": {"max_turns": turns}},
                            "policy": {"config": {"inference_url": policy_url}},
                            "record": {"return_trace": True}})
    assert resp.status_code == 200, resp.text
    return resp.json()["trace"]


def rows_of(db, session_id):
    with sqlite3.connect(db) as conn:
        messages = conn.execute("SELECT message_type, content FROM messages WHERE session_id = ?"
                                " ORDER BY timestamp, id", (session_id,)).fetchall()
        calls = [r[0] for r in conn.execute(
            "SELECT call_records FROM events WHERE session_id = ? AND event_type = 'cais' "
            "ORDER BY id", (session_id,))]
    return messages, calls


def test_a_long_episodes_rows_grow_with_its_turns_and_read_back_whole(
        traced, mock_policy, api_key, tmp_path):
    server, db = traced()
    short = play(server, api_key, mock_policy.url + "/v1", 10, "short")
    long = play(server, api_key, mock_policy.url + "/v1", 40, "long")
    short_rows, short_calls = rows_of(db, short["session_id"])
    long_rows, long_calls = rows_of(db, long["session_id"])
    # In memory each turn holds its whole conversation; stored, each message is one row.
    in_memory = sum(len(s["markov_blanket_messages"]) for s in long["session_time_steps"])
    assert in_memory > 40 * 40  # the square the store no longer keeps
    assert len(long_rows) / 40 <= 1.1 * len(short_rows) / 10
    # A call record holds what its request adds to the call before, naming that call.
    assert max(map(len, long_calls[1:])) < 2 * max(map(len, short_calls[1:]))
    later = json.loads(long_calls[-1])[0]
    assert later["extends"]["messages"] > 100 and len(later["request"]["messages"]) <= 3
    with open_trace_store(str(db), read_only=True) as store:
        for trace in (short, long):  # read back as it was recorded, every message in place
            assert_same(store.get_session(trace["session_id"]).to_dict(), trace)


def test_the_sft_export_rebuilds_each_turns_conversation(traced, mock_policy, api_key,
                                                          tmp_path):
    from synth_deploy.tracing import session_from_trace

    server, db = traced()
    trace = play(server, api_key, mock_policy.url + "/v1", 6, "sft")
    expected = list(sft_examples(session_from_trace(trace)))
    assert len(expected) == 6 and len(expected[-1]["messages"]) > len(expected[0]["messages"])
    out = tmp_path / "sft.jsonl"
    with open_trace_store(str(db), read_only=True) as store:
        result = export_sft(store, out)
    assert result.examples == 6
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [w["messages"] for w in written] == [e["messages"] for e in expected]
    assert [w["tools"] for w in written] == [e["tools"] for e in expected]


def test_synth_ais_filter_reads_each_observation_once_in_order(traced, mock_policy, api_key):
    """`synth-ai filter` reads the messages rows in time order and pairs each user message
    with the assistant reply after it: stored once, each turn is one pair."""
    server, db = traced()
    trace = play(server, api_key, mock_policy.url + "/v1", 5, "filter")
    rows, _ = rows_of(db, trace["session_id"])
    users = [content for kind, content in rows if kind == "user"]
    assert users == [f"You stand at cell {i} of a long corridor." for i in range(5)]
    kinds = [kind for kind, _ in rows]
    assert kinds[0] == "system" and kinds.count("system") == 1
    for i, kind in enumerate(kinds):
        if kind == "user":
            assert "assistant" in kinds[i + 1:i + 3]  # its reply follows it


def test_a_history_window_is_stored_as_it_was_shown_and_read_back_whole(
        traced, mock_policy, api_key):
    server, db = traced(history_turns=2)
    trace = play(server, api_key, mock_policy.url + "/v1", 12, "window")
    with open_trace_store(str(db), read_only=True) as store:
        assert_same(store.get_session(trace["session_id"]).to_dict(), trace)
    rows, calls = rows_of(db, trace["session_id"])
    # Only the system prompt is shared past the window: each turn stores what it showed,
    # which the window bounds.
    assert len(rows) / 12 <= 12
    assert all(json.loads(c)[0]["extends"]["messages"] >= 1 for c in calls[1:])
