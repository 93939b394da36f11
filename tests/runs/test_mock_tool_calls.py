"""The mock policy offered tools: valid, deterministic calls for whatever schema it is given."""

from __future__ import annotations

import json

import httpx

ACTIONS = ["noop", "move_left", "move_right", "do", "sleep"]
TOOL = {"type": "function", "function": {"name": "interact", "parameters": {
    "type": "object", "required": ["actions"], "additionalProperties": False,
    "properties": {"actions": {"type": "array", "minItems": 1, "maxItems": 4,
                               "items": {"type": "string", "enum": ACTIONS}}}}}}
OTHER = {"type": "function", "function": {"name": "wait", "parameters": {
    "type": "object", "properties": {"seconds": {"type": "integer", "minimum": 1,
                                                 "maximum": 3}}, "required": ["seconds"]}}}


_client = httpx.Client(timeout=10)  # one keep-alive connection for the many small calls


def ask(policy, messages, tools=(TOOL,), cid=None, **extra):
    url = policy.url + "/v1/chat/completions" + (f"?cid={cid}" if cid else "")
    resp = _client.post(url, json={"model": "m", "messages": messages, "tools": list(tools),
                                   **extra})
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]


def conversation(n: int) -> list[dict]:
    """A conversation one turn in: the policy called the tool once and got its answer."""
    return [{"role": "system", "content": "Play."}, {"role": "user", "content": f"world {n}"},
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": "call_1", "type": "function",
                "function": {"name": "interact", "arguments": '{"actions": ["noop"]}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": f"world {n}, a turn later"}]


def test_calls_are_valid_for_the_schema_and_the_same_for_the_same_conversation(mock_policy):
    replies = [ask(mock_policy, conversation(n)) for n in range(40)]
    calls = [r["message"]["tool_calls"][0] for r in replies if r["message"].get("tool_calls")]
    assert 28 <= len(calls) < 40  # about one later reply in ten is text, as small models do
    for call in calls:
        assert call["function"]["name"] == "interact" and call["id"].startswith("call_")
        actions = json.loads(call["function"]["arguments"])["actions"]
        assert 1 <= len(actions) <= 4 and set(actions) <= set(ACTIONS)
    assert {r["finish_reason"] for r in replies} == {"tool_calls", "stop"}
    assert [ask(mock_policy, conversation(n)) for n in range(10)] == replies[:10]
    assert len({c["function"]["arguments"] for c in calls}) > len(calls) // 2


def test_a_first_turn_always_calls_a_tool(mock_policy):
    # A prompt every seed shares got the text reply on every seed's first turn.
    for prompt in ["I picked a number from 1 to 10. Guess it.", *(f"world {n}" for n in
                                                                  range(60))]:
        first = [{"role": "system", "content": "Play."}, {"role": "user", "content": prompt}]
        assert ask(mock_policy, first)["message"].get("tool_calls"), prompt


def test_after_a_reply_without_a_call_the_next_one_calls(mock_policy):
    texts = [n for n in range(40)
             if not ask(mock_policy, conversation(n))["message"].get("tool_calls")]
    assert texts
    for n in texts:
        corrected = conversation(n) + [{"role": "assistant", "content": "thinking"},
                                       {"role": "user", "content": "Call the tool."}]
        assert ask(mock_policy, corrected)["message"]["tool_calls"]


def test_tool_choice_is_honoured(mock_policy):
    named = {"type": "function", "function": {"name": "wait"}}
    for n in range(8):
        call = ask(mock_policy, conversation(n), tools=(TOOL, OTHER),
                   tool_choice=named)["message"]["tool_calls"][0]["function"]
        assert call["name"] == "wait" and json.loads(call["arguments"])["seconds"] in (1, 2, 3)
        assert ask(mock_policy, conversation(n), tool_choice="required")["message"][
            "tool_calls"]
    assert ask(mock_policy, conversation(1), tool_choice="none")["message"]["content"]


def test_sampling_is_keyed_by_the_correlation_id(mock_policy):
    def args(cid):
        reply = ask(mock_policy, conversation(7), tool_choice="required", cid=cid,
                    temperature=1.0)
        return reply["message"]["tool_calls"][0]["function"]["arguments"]

    assert args("run-a") == args("run-a")
    assert len({args(f"run-{i}") for i in range(8)}) > 1


def test_a_pydantic_schema_is_followed_through_its_refs(mock_policy):
    # pydantic puts an enum (and a nested model) in $defs behind a $ref: the mock sent "mock".
    from enum import StrEnum

    from pydantic import BaseModel

    class Direction(StrEnum):
        north, south = "north", "south"

    class Target(BaseModel):
        cell: int

    class MoveAction(BaseModel):
        direction: Direction
        target: Target

    schema = MoveAction.model_json_schema()
    assert "$ref" in json.dumps(schema["properties"])
    tool = {"type": "function", "function": {"name": "move", "parameters": schema}}
    made = [c for n in range(1, 12)
            for c in ask(mock_policy, conversation(n), tools=(tool,))["message"].get(
                "tool_calls") or ()]
    assert len(made) >= 8  # about one reply in ten is text
    for call in made:
        MoveAction.model_validate(json.loads(call["function"]["arguments"]))
