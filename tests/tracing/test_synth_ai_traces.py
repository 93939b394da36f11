"""synth-ai's traces and trace files with ours (issue 11, items 4-6): every trace shape its task
apps return is read, storing a stored session again is idempotent, and the read commands
never change a byte of a file synth-ai writes (or keeps writing after we migrated it)."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest
from sessions import assert_same, make_session
from synth_ai_rules import build_trace_payload, session_trace_dict, write_like_session_tracer
from typer.testing import CliRunner

from synth_deploy.cli import app
from synth_deploy.errors import TraceStoreError
from synth_deploy.tracing import (
    SCHEMA_VERSION,
    SessionConflictError,
    TraceFormatError,
    open_trace_store,
    session_from_trace,
)

runner = CliRunner()
COMPLETION = {"choices": [{"message": {"role": "assistant", "content": "4"},
                           "finish_reason": "stop"}],
              "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13}}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def traces(*args: str):
    return runner.invoke(app, ["traces", *args], env={})


# -- trace shapes (item 4) ------------------------------------------------------------------


def test_the_trace_build_trace_payload_makes_is_read_whole():
    trace = build_trace_payload([{"role": "user", "content": "2+2?"}], COMPLETION,
                                correlation_id="trace_x", session_id="sess-helper")
    session = session_from_trace(trace)
    assert session.session_id == "sess-helper"  # kept under metadata, not at the top
    (event,) = session.events
    assert event.event_type == "cais" and event.usage == COMPLETION["usage"]
    assert (event.input_tokens, event.output_tokens, event.total_tokens) == (12, 1, 13)
    assert event.metadata["correlation_id"] == "trace_x"
    # No messages were recorded: the LM call's prompt and reply stand in (what SFT exports).
    assert [(m.message_type, m.content) for m in session.messages] == [
        ("user", "2+2?"), ("assistant", "4")]
    assert session.metadata["trace_correlation_id"] == "trace_x"


def test_the_v3_session_of_synth_ais_tracer_is_read_whole():
    session = session_from_trace(session_trace_dict("sess-v3", reward=0.5))
    assert session.session_id == "sess-v3" and session.created_at > 0
    (step,) = session.timesteps
    lm, env = step.events
    assert (lm.event_type, lm.model_name, lm.total_tokens) == ("cais", "qwen", 14)
    assert lm.usage == {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
    assert (env.event_type, env.reward, env.terminated) == ("environment", 0.5, True)
    assert [m.content for m in step.messages] == ["What is 2 + 2?", {"answer": 4}]
    assert step.turn_number == 1 and session.metadata["env_name"] == "crafter"


def test_wrapped_and_id_less_traces_are_read_and_junk_is_a_clear_error():
    wrapped = {"session_trace": session_trace_dict("inner"), "metadata": {"run_id": "r"}}
    assert session_from_trace(wrapped).session_id == "inner"
    assert session_from_trace(wrapped).metadata["run_id"] == "r"
    history_only = {"event_history": [{"type": "lm_call", "llm_request": {"messages": []},
                                       "llm_response": COMPLETION["choices"][0]}]}
    session = session_from_trace(history_only, session_id="run-42")
    assert session.session_id == "run-42" and len(session.events) == 1
    assert session_from_trace(history_only, session_id="run-42").events[0].id == \
        session.events[0].id  # ids derived, not random: the same trace stores the same rows
    with pytest.raises(TraceFormatError, match="names no session_id"):
        session_from_trace(history_only)
    with pytest.raises(TraceFormatError, match="not a JSON object"):
        session_from_trace(["not", "a", "trace"])
    with pytest.raises(TraceFormatError, match="cannot be read"):
        session_from_trace({"session_id": "s", "session_time_steps": [{"step_index": "x",
                                                                       "events": 5}],
                            "created_at": {"bad": 1}, "outcome_rewards": [{"nope": 1}]})


def test_a_returned_traces_counts_a_policy_server_made_up_are_read_as_none():
    # A synth-ai app records the usage its policy server answered, whatever it was.
    huge = 10**400
    trace = {"session_id": "s", "event_history": [{
        "type": "lm_call", "input_tokens": float("inf"), "output_tokens": huge,
        "total_tokens": float("nan"), "latency_ms": huge, "llm_request": {"messages": []},
        "llm_response": COMPLETION["choices"][0]}]}
    [event] = session_from_trace(trace).events
    assert (event.input_tokens, event.output_tokens, event.total_tokens) == (None, None, None)
    assert event.latency_ms is None


def test_our_own_trace_round_trips_through_the_same_reader():
    session = make_session(3)
    assert_same(session_from_trace(json.loads(json.dumps(session.to_dict()))).to_dict(),
                session.to_dict())


# -- idempotent storing (item 5) -------------------------------------------------------------


def test_storing_a_stored_session_again_is_idempotent_and_other_content_conflicts(tmp_path):
    session = make_session(1)
    returned = session_from_trace(json.loads(json.dumps(session.to_dict())))
    with open_trace_store(tmp_path / "t.db") as store:
        store.write_session_sync(session)
        store.write_session_sync(returned)  # what a smoke run stores after the server did
        assert store.count_sessions() == 1
        assert store.table_counts()["events"] == len(session.events)
        returned.metadata["seed"] = 99
        with pytest.raises(SessionConflictError, match="different content") as info:
            store.write_session_sync(returned)
        assert "own session id" in info.value.hint
        assert store.get_session(session.session_id).metadata["seed"] == 1


def test_the_same_session_twice_in_one_batch_is_stored_once(tmp_path):
    import asyncio

    session = make_session(2)

    async def both(store):
        await asyncio.gather(store.write_session(session), store.write_session(session))

    with open_trace_store(tmp_path / "t.db") as store:
        asyncio.run(both(store))
        assert store.count_sessions() == 1


# -- read-only commands on synth-ai's files (item 6) -----------------------------------------


def synth_ai_file(path: Path) -> None:
    write_like_session_tracer(path, "sess_a", {"env_name": "crafter", "seed": 1,
                                               "model": "qwen", "run_id": "a"}, reward=1.0)
    write_like_session_tracer(path, "sess_b", {"env_name": "crafter", "seed": 2,
                                               "model": "qwen", "run_id": "b"}, reward=0.0)


@pytest.mark.parametrize("command", [
    ["where"], ["ls"], ["stats"], ["show", "sess_a"],
    ["export", "-o", "{out}", "--min-reward", "1"],
])
def test_read_commands_never_change_a_byte_of_synth_ais_file(tmp_path, command):
    db = tmp_path / "synth_ai.db"
    synth_ai_file(db)
    before, files = sha(db), sorted(p.name for p in tmp_path.iterdir())
    args = [a.format(out=tmp_path / "out" / "sft.jsonl") for a in command]
    result = traces(*args, "--trace-db", str(db))
    assert result.exit_code == 0, result.output
    assert sha(db) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "out") == files
    assert sqlite3.connect(db).execute(
        "SELECT name FROM sqlite_master WHERE name = 'synth_deploy_schema'").fetchall() == []


def test_read_commands_read_synth_ais_layout_as_it_is(tmp_path):
    db = tmp_path / "synth_ai.db"
    synth_ai_file(db)
    rows = json.loads(traces("ls", "--json", "--trace-db", str(db)).stdout)
    assert sorted((r["session_id"], r["app_id"], r["seed"], r["model"], r["status"],
                   r["total_reward"]) for r in rows) == [
        ("sess_a", "crafter", 1, "qwen", "ok", 1.0), ("sess_b", "crafter", 2, "qwen", "ok", 0.0)]
    stats = json.loads(traces("stats", "--json", "--trace-db", str(db)).stdout)
    assert stats["cost_usd"] == pytest.approx(0.5)  # synth-ai stores cents
    where = json.loads(traces("where", "--json", "--trace-db", str(db)).stdout)
    assert where["schema_version"] == 1 and where["counts"]["session_traces"] == 2
    out = tmp_path / "sft.jsonl"
    result = traces("export", "-o", str(out), "--app", "crafter", "--min-reward", "1",
                    "--trace-db", str(db))
    assert result.exit_code == 0, result.output
    (example,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert example["messages"] == [{"role": "user", "content": "What is 3 + 4?"},
                                   {"role": "assistant", "content": "7"}]
    with open_trace_store(db, read_only=True) as store:
        with pytest.raises(TraceStoreError, match="read-only"):
            store.write_session_sync(make_session())


def test_our_wal_file_opened_read_only_leaves_nothing_behind(tmp_path):
    db = tmp_path / "ours.db"
    with open_trace_store(db) as store:
        store.write_session_sync(make_session())
    before, files = sha(db), sorted(p.name for p in tmp_path.iterdir())
    assert traces("ls", "--trace-db", str(db)).exit_code == 0
    assert sha(db) == before and sorted(p.name for p in tmp_path.iterdir()) == files


def test_sessions_synth_ai_writes_after_init_are_listed_and_exported(tmp_path):
    db = tmp_path / "synth_ai.db"
    synth_ai_file(db)
    assert traces("init", "--trace-db", str(db)).exit_code == 0  # the explicit migration
    # synth-ai keeps writing: its own statements, none of our columns. One session's status
    # and model arrive only in end_session's metadata update.
    write_like_session_tracer(db, "sess_c", {"env_name": "crafter", "seed": 3, "model": "qwen",
                                             "run_id": "c"}, reward=1.0)
    write_like_session_tracer(db, "sess_d", {"app_id": "sokoban", "seed": 4, "model": "qwen",
                                             "status": "error", "run_id": "d"}, reward=1.0,
                              start_metadata={})
    rows = json.loads(traces("ls", "--json", "--trace-db", str(db)).stdout)
    by_id = {r["session_id"]: r for r in rows}
    assert (by_id["sess_c"]["app_id"], by_id["sess_c"]["seed"], by_id["sess_c"]["model"],
            by_id["sess_c"]["total_reward"]) == ("crafter", 3, "qwen", 1.0)
    assert (by_id["sess_d"]["app_id"], by_id["sess_d"]["status"]) == ("sokoban", "error")
    # The columns themselves are filled (triggers), so every reader and index sees them.
    stored = dict(sqlite3.connect(db).execute(
        "SELECT session_id, total_reward FROM session_traces WHERE app_id = 'crafter'"))
    assert stored == {"sess_a": 1.0, "sess_b": 0.0, "sess_c": 1.0}
    out = tmp_path / "sft.jsonl"
    result = traces("export", "-o", str(out), "--min-reward", "1", "--json",
                    "--trace-db", str(db))
    assert json.loads(result.stdout)["sessions"] == 2  # a and c; d failed
    result = traces("export", "-o", str(out), "--app", "crafter", "--force", "--json",
                    "--trace-db", str(db))
    assert json.loads(result.stdout)["sessions"] == 3


def test_a_file_migrated_before_the_triggers_is_read_right_without_migrating(tmp_path):
    db = tmp_path / "v2.db"
    synth_ai_file(db)
    conn = sqlite3.connect(db)  # what our version 2 migration left: columns, no triggers
    for column, kind in (("app_id", "VARCHAR"), ("run_id", "VARCHAR"), ("status", "VARCHAR"),
                         ("model_name", "VARCHAR"), ("seed", "INTEGER"),
                         ("total_reward", "FLOAT")):
        conn.execute(f"ALTER TABLE session_traces ADD COLUMN {column} {kind}")
    for table, column in (("events", "event_uid"), ("messages", "message_uid")):
        conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} VARCHAR")
    conn.execute("CREATE TABLE synth_deploy_schema (version INTEGER PRIMARY KEY, applied_at "
                 "TEXT NOT NULL, description TEXT NOT NULL)")
    conn.execute("INSERT INTO synth_deploy_schema VALUES (2, 'x', 'v2')")
    conn.execute("UPDATE session_traces SET app_id = 'crafter', status = 'ok', "
                 "total_reward = 1.0 WHERE session_id = 'sess_a'")
    conn.commit()
    conn.close()
    write_like_session_tracer(db, "sess_c", {"env_name": "crafter", "seed": 3, "model": "qwen",
                                             "run_id": "c"}, reward=1.0)
    before = sha(db)
    with open_trace_store(db, read_only=True) as store:
        assert store.schema_version == 2
        found = {s.session_id for s in store.list_sessions(app="crafter", min_reward=1.0)}
        assert found == {"sess_a", "sess_c"}
    assert sha(db) == before
    with open_trace_store(db) as store:  # our writer migrates it: the columns get filled
        assert store.schema_version == SCHEMA_VERSION
    assert sqlite3.connect(db).execute(
        "SELECT app_id FROM session_traces WHERE session_id = 'sess_c'").fetchone() == (
        "crafter",)


def test_sft_export_writes_tools_in_the_form_synth_ai_reads(tmp_path):
    from synth_ai_rules import sft_example_problem

    from synth_deploy.tracing import SessionTracer, export_sft

    nested = [{"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}}}}]
    tracer = SessionTracer(metadata={"app_id": "tools", "status": "ok"})
    tracer.record_message("user", "What is 2 + 2?")
    tracer.record_lm_call(model_name="m", call_records=[{"request": {
        "messages": [{"role": "user", "content": "What is 2 + 2?"}], "tools": nested}}])
    tracer.record_message("assistant", "", metadata={"tool_calls": [{
        "id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}]})
    with open_trace_store(tmp_path / "t.db") as store:
        store.write_session_sync(tracer.finish())
        export_sft(store, tmp_path / "sft.jsonl")
    (example,) = [json.loads(x) for x in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert example["tools"] == [{"type": "function", **nested[0]["function"]}]
    assert sft_example_problem(example) is None
