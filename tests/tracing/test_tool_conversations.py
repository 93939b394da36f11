"""Multi-turn tool-calling conversations in traces: recorded once per turn, exported as SFT
examples with their tool calls and tools, and replayed without repeating earlier turns."""

from __future__ import annotations

import json

import pytest

from synth_deploy.taskapp import image_part, png_data_url, text_part
from synth_deploy.taskapp.tools import tool_message
from synth_deploy.tracing import (
    SessionTracer,
    message_text,
    open_trace_store,
    replay,
    sft_examples,
)
from synth_deploy.train import validate_sft_example

TOOLS = [{"type": "function", "function": {"name": "interact", "parameters": {
    "type": "object", "properties": {"actions": {"type": "array"}}}}}]
PNG = b"\x89PNG\r\n\x1a\n" + bytes(40)


def call(call_id: str, actions: list[str]) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [{
        "id": call_id, "type": "function",
        "function": {"name": "interact", "arguments": f'{{"actions": {actions!r}}}'.replace(
            "'", '"')}}]}


def policy_call(tracer: SessionTracer, prompt: list[dict], reply: dict) -> None:
    """What call_policy records for one call: the LM call, then the bytes it sent and
    the bytes the policy answered."""
    event = tracer.record_lm_call(model_name="m")
    tracer.record_exchange(
        event, json.dumps({"model": "m", "messages": prompt, "tools": TOOLS}).encode(),
        json.dumps({"choices": [{"message": {**reply, "refusal": None}}],
                    "usage": {"prompt_tokens": 9, "completion_tokens": 2}}).encode())


def chat_call(tracer: SessionTracer, prompt: list[dict], reply: dict) -> None:
    """The same call recorded as an app recording its own chat would: the prompt, the LM
    call with its record, the reply."""
    tracer.record_chat(prompt)
    tracer.record_lm_call(model_name="m", call_records=[{
        "request": {"model": "m", "messages": prompt, "tools": TOOLS},
        "response": {**reply, "refusal": None},
        "usage": {"prompt_tokens": 9, "completion_tokens": 2}}])
    tracer.record_chat([*prompt, reply])


def two_turns(policy_call=policy_call) -> SessionTracer:
    tracer = SessionTracer(metadata={"app_id": "game", "seed": 4})
    system = {"role": "system", "content": "Play."}
    obs1 = {"role": "user", "content": [text_part("turn 1"), image_part(png_data_url(PNG))]}
    tracer.start_timestep("turn-1", turn_number=1)
    policy_call(tracer, [system, obs1], {"role": "assistant", "content": "hmm"})
    correction = {"role": "user", "content": "Call the tool."}
    prompt = [system, obs1, {"role": "assistant", "content": "hmm"}, correction]
    policy_call(tracer, prompt, call("c1", ["do"]))
    tracer.start_timestep("turn-2", turn_number=2)
    history = [system, {"role": "user", "content": "turn 1"},
               {"role": "assistant", "content": "hmm"}, correction, call("c1", ["do"]),
               tool_message("c1", "Took do."), {"role": "user", "content": "turn 2"}]
    policy_call(tracer, history, call("c2", ["noop"]))
    tracer.record_outcome_reward(1.0)
    return tracer


def test_a_retried_call_in_one_turn_records_its_conversation_once():
    session = two_turns().finish()
    first, second = session.timesteps
    assert [(m.message_type, "parts" if isinstance(m.content, list) else m.content)
            for m in first.messages] == [
        ("system", "Play."), ("user", "parts"), ("assistant", "hmm"),
        ("user", "Call the tool."), ("assistant", None)]
    assert first.messages[-1].metadata["tool_calls"][0]["id"] == "c1"
    assert [m.message_type for m in second.messages] == [
        "system", "user", "assistant", "user", "assistant", "tool_result", "user", "assistant"]
    assert second.messages[5].metadata == {"tool_call_id": "c1"}


def read(session) -> list:
    session.expand_exchanges()  # what a store does as it builds rows
    return [([(m.message_type, m.content, m.metadata) for m in step.messages],
             [e.call_records for e in step.events]) for step in session.timesteps]


def test_policy_calls_kept_as_wire_bytes_read_as_the_chat_they_carried():
    session = two_turns().finish(expand=False)
    # The calls are still the bytes they were: a served app's loop never turns them into
    # messages (its store's writer does, or whoever reads them).
    assert [len(step.exchanges) for step in session.timesteps] == [2, 1]
    assert [step.messages for step in session.timesteps] == [[], []]
    assert read(session) == read(two_turns(chat_call).finish())
    assert [step.exchanges for step in session.timesteps] == [[], []]
    assert session.timesteps[0].events[0].call_records[0]["usage"]["prompt_tokens"] == 9


@pytest.mark.parametrize("calls", [policy_call, chat_call])
def test_what_an_app_records_between_policy_calls_keeps_its_place(calls):
    tracer = SessionTracer()
    prompt = [{"role": "user", "content": "Go."}]
    calls(tracer, prompt, {"role": "assistant", "content": "a"})
    tracer.record_message("user", "a note of the app's own")
    calls(tracer, [*prompt, {"role": "assistant", "content": "a"},
                   {"role": "user", "content": "Again."}], {"role": "assistant", "content": "b"})
    (messages, _), = read(tracer.finish())
    assert [m[1] for m in messages] == ["Go.", "a", "a note of the app's own", "Again.", "b"]


@pytest.mark.parametrize("calls", [policy_call, chat_call])
def test_a_policy_call_continuing_the_apps_own_chat_adds_only_what_is_new(calls):
    tracer = SessionTracer()
    prompt = [{"role": "system", "content": "Play."}, {"role": "user", "content": "Go."}]
    tracer.record_chat(prompt)
    calls(tracer, prompt, {"role": "assistant", "content": "a"})
    assert [m.content for m in tracer.current_timestep.messages] == ["Play.", "Go.", "a"]
    assert [m.content for m in tracer.session.messages] == ["Play.", "Go.", "a"]


def test_bytes_that_are_no_chat_call_are_kept_as_text_and_the_session_is_stored(tmp_path):
    tracer = SessionTracer()
    tracer.record_exchange(tracer.record_lm_call(model_name="m"), b'{"messages": "hi"}',
                           b"\xffnot json")
    session = tracer.finish(expand=False)
    with open_trace_store(tmp_path / "t.db") as store:
        store.write_session_sync(session)
        (step,) = store.database.session(session.session_id).timesteps
    (record,) = step.events[0].call_records
    assert record == {"request_text": '{"messages": "hi"}', "response_text": "\ufffdnot json",
                      "error": "not read as a chat call: UnicodeDecodeError"}
    assert step.messages == []


def test_a_call_whose_json_escapes_a_lone_surrogate_is_still_a_chat_call():
    # Valid JSON that some parsers refuse: the call is read as Python's json reads it.
    tracer = SessionTracer()
    answer = b'{"choices": [{"message": {"role": "assistant", "content": "a\\ud800"}}]}'
    tracer.record_exchange(tracer.record_lm_call(model_name="m"),
                           b'{"messages": [{"role": "user", "content": "Go."}]}', answer)
    (step,) = tracer.finish().timesteps
    assert [m.content for m in step.messages] == ["Go.", "a\ud800"]
    assert step.events[0].call_records[0]["response"]["content"] == "a\ud800"


def test_a_chat_recorded_before_any_timestep_starts_one_that_precedes_its_messages():
    tracer = SessionTracer()
    recorded = tracer.record_chat([{"role": "system", "content": "Play."},
                                   {"role": "user", "content": "Go."}])
    (step,) = tracer.finish().timesteps
    assert step.messages == recorded and len(recorded) == 2
    assert all(step.timestamp <= m.timestamp for m in recorded)


def test_export_gives_tool_calling_conversations_the_validator_accepts():
    first, second = sft_examples(two_turns().finish())
    # Tools in the flat form synth-ai's SFT reader takes.
    assert first["tools"] == [{"type": "function", **TOOLS[0]["function"]}]
    assert first["metadata"]["turn"] == 1
    assert first["messages"][1]["content"][1]["image_url"]["url"].startswith(
        "data:image/png;base64,")
    assert second["messages"][5] == {"role": "tool", "content": "Took do.",
                                     "tool_call_id": "c1"}
    assert second["messages"][-1]["tool_calls"][0]["function"]["name"] == "interact"
    assert second["messages"][-1]["content"] is None
    for example in (first, second):
        assert validate_sft_example(example) == []


def test_replay_shows_each_message_once_and_images_as_tags():
    session = two_turns().finish()
    first, second = replay(session)
    assert first.repeated == 0 and len(first.messages) == 5
    assert "[image image/png, 0.0 KB]" in message_text(first.messages[1])
    assert message_text(first.messages[-1]) == '→ interact({"actions": ["do"]})'
    # Turn 2 repeats turn 1 (its observation now as text only) and adds three messages.
    assert second.repeated == 5
    assert [message_text(m) for m in second.messages] == [
        "[c1] Took do.", "turn 2", '→ interact({"actions": ["noop"]})']


def test_an_exchange_recorded_after_a_later_event_belongs_to_its_own_call():
    tracer = SessionTracer()
    call = tracer.record_lm_call(model_name="m")
    later = tracer.record_environment_event(reward=1.0)
    tracer.record_exchange(call, b'{"messages": [{"role": "user", "content": "hi"}]}',
                           b'{"choices": [{"message": {"role": "assistant", "content": "yo"}}]}')
    (step,) = tracer.session.timesteps
    assert [e.event_type for e in step.events] == ["cais", "environment"]
    assert step.events[0].call_records[0]["response"]["content"] == "yo"
    assert step.events[1].call_records is None
    assert later is step.events[1]
