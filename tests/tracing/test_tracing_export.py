"""SFT export from stored rollouts, checked by the train package's SFT validator."""

from __future__ import annotations

import asyncio
import json

import pytest
from rollouts import fire, rollout_body
from typer.testing import CliRunner

from synth_deploy.cli import app as cli_app
from synth_deploy.errors import UsageError
from synth_deploy.serving import create_app
from synth_deploy.tracing import SessionTracer, export_sft, open_trace_store, sft_examples
from synth_deploy.train import validate_sft_file


def test_rollouts_export_to_valid_sft(tmp_path, serve, math_config, api_key, mock_policy):
    with open_trace_store(str(tmp_path / "t.db")) as store:
        server = serve(create_app(math_config, api_keys=[api_key], trace_store=store))
        bodies = [rollout_body(f"run-{i}", i, mock_policy.url + "/v1") for i in range(24)]
        bodies.append(rollout_body("broken", 2, "http://127.0.0.1:9/v1"))
        asyncio.run(fire(server.url, api_key, bodies))
        sessions = store.list_sessions(limit=None, status="ok")
        out = tmp_path / "sft.jsonl"
        result = export_sft(store, out)

        check = validate_sft_file(out)
        assert check.ok, check.errors
        assert check.count == result.examples
        lines = [json.loads(line) for line in out.read_text().splitlines()]
        assert {ex["metadata"]["run_id"] for ex in lines} == {s.run_id for s in sessions}
        first = lines[0]["messages"]
        assert [m["role"] for m in first[:2]] == ["system", "user"]
        assert first[-1]["role"] == "assistant" and first[-1]["content"]

        winners = {s.run_id for s in sessions if (s.total_reward or 0) >= 1.0}
        assert winners and winners != {s.run_id for s in sessions}  # the filter must bite
        best = export_sft(store, tmp_path / "best.jsonl", min_reward=1.0)
        best_runs = {json.loads(line)["metadata"]["run_id"]
                     for line in (tmp_path / "best.jsonl").read_text().splitlines()}
        assert best_runs == winners and best.examples >= len(winners)
        assert validate_sft_file(tmp_path / "best.jsonl").ok

        assert export_sft(store, tmp_path / "lim.jsonl", limit=3).examples == 3
        assert export_sft(store, tmp_path / "none.jsonl", app="nope").examples == 0
        assert export_sft(store, tmp_path / "m.jsonl", model="other-model").examples == 0
        assert export_sft(store, tmp_path / "since.jsonl", since="1h").examples == \
            result.examples
        assert export_sft(store, tmp_path / "future.jsonl", since="2999-01-01").examples == 0


def test_export_keeps_an_existing_file_and_skips_prompt_only_sessions(tmp_path):
    with open_trace_store(str(tmp_path / "t.db")) as store:
        tracer = SessionTracer(metadata={"app_id": "x", "status": "ok"})
        tracer.record_message("user", "no reply was ever recorded")
        store.write_session_sync(tracer.finish())
        out = tmp_path / "keep.jsonl"
        out.write_text("precious\n")
        with pytest.raises(UsageError, match="already exists"):
            export_sft(store, out)
        assert out.read_text() == "precious\n"
        result = export_sft(store, out, overwrite=True)
        assert (result.examples, result.skipped_sessions) == (0, 1)
        assert out.read_text() == ""
        assert not list(tmp_path.glob(".keep.jsonl.*"))


def test_message_metadata_that_is_not_an_object_is_read_as_none(tmp_path):
    # Files written by other tools may hold anything in messages.metadata: the example still
    # comes out, with plain messages.
    path = tmp_path / "t.db"
    with open_trace_store(str(path)) as store:
        tracer = SessionTracer(metadata={"app_id": "x", "status": "ok"})
        tracer.start_timestep("turn-1")
        tracer.record_message("user", "2+2?")
        tracer.record_message("assistant", "4")
        store.write_session_sync(tracer.finish())
    import sqlite3

    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE messages SET metadata = '[1, 2]'")
        conn.execute("UPDATE messages SET metadata = 'not json' WHERE message_type = 'user'")
    with open_trace_store(str(path), read_only=True) as store:
        out = tmp_path / "sft.jsonl"
        assert export_sft(store, out).examples == 1
    example = json.loads(out.read_text())
    assert example["messages"] == [{"role": "user", "content": "2+2?"},
                                   {"role": "assistant", "content": "4"}]


def test_an_example_ends_at_the_last_reply_and_needs_a_prompt_before_it(tmp_path):
    # Each timestep is one candidate example; the stored (paged) export and the in-memory
    # `sft_examples` must cut them alike.
    steps = {
        "reply-only": [("assistant", "hi")],
        "reply-first": [("assistant", "hi"), ("user", "and?")],
        "prompt-only": [("system", "be brief"), ("user", "2+2?")],
        "trailing-prompt": [("system", "be brief"), ("user", "2+2?"), ("assistant", "4"),
                            ("user", "sure?")],
        "two-replies": [("user", "2+2?"), ("assistant", "4"), ("assistant", "yes, 4")],
    }
    tracer = SessionTracer(metadata={"app_id": "x", "status": "ok"})
    for step_id, messages in steps.items():
        tracer.start_timestep(step_id)
        for role, text in messages:
            tracer.record_message(role, text)
    session = tracer.finish()
    in_memory = list(sft_examples(session))
    with open_trace_store(str(tmp_path / "t.db")) as store:
        store.write_session_sync(session)
        out = tmp_path / "sft.jsonl"
        assert export_sft(store, out).examples == 2
    stored = [json.loads(line) for line in out.read_text().splitlines()]
    assert stored == in_memory
    assert [(e["metadata"]["step_id"], [m["content"] for m in e["messages"]])
            for e in stored] == [("trailing-prompt", ["be brief", "2+2?", "4"]),
                                 ("two-replies", ["2+2?", "4", "yes, 4"])]


GUESS_TOOLS = [{"type": "function", "function": {
    "name": "guess", "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}}}]


def guessing_session(reward: float):
    """A guessing game through a tool-calling policy: on turn 1 the model thinks aloud
    instead of guessing (the mock policy's "Let me think about what to do next."), on turn 2
    it guesses."""
    tracer = SessionTracer(metadata={"app_id": "guess", "status": "ok", "model": "mock"})
    for turn, reply in ((1, {"role": "assistant", "content": "Let me think about what to do "
                                                             "next."}),
                        (2, {"role": "assistant", "content": None, "tool_calls": [{
                            "id": "c1", "type": "function",
                            "function": {"name": "guess", "arguments": "{\"n\": 5}"}}]})):
        tracer.start_timestep(f"turn-{turn}", turn_number=turn)
        prompt = [{"role": "system", "content": "Guess the number, 1 to 10."},
                  {"role": "user", "content": f"Turn {turn}: your guess?"}]
        tracer.record_chat(prompt)
        tracer.record_lm_call(model_name="mock", call_records=[{"request": {
            "messages": prompt, "tools": GUESS_TOOLS}}])
        tracer.record_chat([*prompt, reply])
    tracer.record_outcome_reward(reward)
    return tracer.finish()


def test_a_text_reply_where_tools_were_offered_is_no_example(tmp_path):
    session = guessing_session(1.0)
    with open_trace_store(tmp_path / "t.db") as store:
        store.write_session_sync(session)
        store.write_session_sync(guessing_session(0.0))
        result = export_sft(store, tmp_path / "sft.jsonl", min_reward=1)
    [example] = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert example["metadata"]["turn"] == 2 and example["messages"][-1]["tool_calls"]
    assert (result.examples, result.sessions) == (1, 1)
    assert result.skipped_turns == {"text_instead_of_tool_call": 1}
    assert "1 turn(s) that answered the tools offered with text" in result.note
    assert list(sft_examples(session)) == [example]  # in memory, the same rule


def test_an_export_of_nothing_says_why(tmp_path):
    path = tmp_path / "t.db"
    tracer = SessionTracer(metadata={"app_id": "plain", "status": "ok", "model": "m"})
    tracer.record_environment_event(reward=1.0, terminated=True)  # no policy call at all
    tracer.record_outcome_reward(1.0)
    with open_trace_store(path) as store:
        store.write_session_sync(tracer.finish())
    runner = CliRunner()
    for args, why in ((["--app", "plain"], "1 session(s) pass the filters but hold no "
                       "example: they recorded no policy reply"),
                      (["--app", "other"], "no stored session passes the filters")):
        out = tmp_path / f"{args[1]}.jsonl"
        shown = runner.invoke(cli_app, ["traces", "export", "--trace-db", str(path),
                                        "--out", str(out), *args])
        assert shown.exit_code == 0, shown.output
        assert "wrote 0 example(s)" in shown.stdout and why in " ".join(shown.stderr.split())
        doc = runner.invoke(cli_app, ["traces", "export", "--trace-db", str(path), "--out",
                                      str(out), "--force", "--json", *args])
        assert why in json.loads(doc.stdout)["note"]
