"""The mock policy's tool calls: valid calls for whatever tools a request offers.

Given ``tools``, the mock answers like a small tool-calling model: it calls one of the offered
functions (the one ``tool_choice`` names, if any) with arguments drawn from the function's
JSON schema (enum values, array lengths within ``minItems``/``maxItems``, required
properties), so a multi-turn environment gets a legal, varied game. About one later reply in
ten is plain text with no tool call, as small models do, so an app's corrective path gets
exercised; the first reply of a conversation (no assistant turn yet) and a reply right after
such a miss always call a tool, as does any reply when ``tool_choice`` is "required" or names
a function. The draw is keyed by the whole conversation: the same conversation (the same
seed, turn after turn) always gets the same call, unless a sample key is given.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping, Sequence
from typing import Any

TEXT_REPLY_RATE = 0.1
TEXT_REPLY = "Let me think about what to do next."
_MAX_DEPTH = 6


def mock_tool_reply(messages: Sequence[Mapping[str, Any]], tools: Sequence[Any], *,
                    tool_choice: Any = None, sample: str | None = None) -> dict[str, Any]:
    """The assistant message answering ``messages`` when ``tools`` are offered."""
    functions = [t["function"] for t in tools if _is_function(t)]
    key = json.dumps(list(messages), sort_keys=True, default=str) + (sample or "")
    rng = random.Random(hashlib.sha256(key.encode()).digest())
    if not functions or tool_choice == "none":
        return {"role": "assistant", "content": TEXT_REPLY}
    chosen = _named_choice(tool_choice, functions)
    if chosen is None and _may_answer_text(messages, tool_choice) \
            and rng.random() < TEXT_REPLY_RATE:
        return {"role": "assistant", "content": TEXT_REPLY}
    return {"role": "assistant", "content": None,
            "tool_calls": [_tool_call(chosen or rng.choice(functions), key, rng)]}


def _tool_call(function: Mapping[str, Any], key: str, rng: random.Random) -> dict[str, Any]:
    """A call of ``function`` with sampled arguments; its id is keyed by the conversation."""
    arguments = sample_schema(function.get("parameters") or {"type": "object"}, rng)
    call_id = "call_" + hashlib.sha256(f"{key}:{function['name']}".encode()).hexdigest()[:24]
    return {"id": call_id, "type": "function",
            "function": {"name": function["name"], "arguments": json.dumps(arguments)}}


def _is_function(tool: Any) -> bool:
    """Whether an offered tool is a named function (the only kind the mock calls)."""
    return (isinstance(tool, Mapping) and tool.get("type", "function") == "function"
            and isinstance(tool.get("function"), Mapping) and bool(tool["function"].get("name")))


def _may_answer_text(messages: Sequence[Mapping[str, Any]], tool_choice: Any) -> bool:
    """Whether this reply may be plain text: not a first turn (a prompt every seed shares
    would get it on every seed), not right after a miss, not when a call is required."""
    first_turn = not any(m.get("role") == "assistant" for m in messages)
    return not first_turn and not _missed_a_call(messages) and tool_choice != "required"


def _named_choice(tool_choice: Any, functions: list[Mapping[str, Any]]
                  ) -> Mapping[str, Any] | None:
    if isinstance(tool_choice, Mapping):
        name = (tool_choice.get("function") or {}).get("name")
        return next((f for f in functions if f["name"] == name), None)
    return None


def _missed_a_call(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the last assistant turn came without a tool call (and was then corrected)."""
    for m in reversed(messages):
        if m.get("role") == "assistant":
            return not m.get("tool_calls")
    return False


def sample_schema(schema: Mapping[str, Any], rng: random.Random, depth: int = 0,
                  root: Mapping[str, Any] | None = None) -> Any:
    """A value that satisfies the common JSON-schema keywords of ``schema`` (``$ref``s into
    its ``$defs``, where pydantic puts enums and nested models, followed)."""
    root = schema if root is None else root
    if depth > _MAX_DEPTH:
        return None
    schema = _resolved(schema, root)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return rng.choice(list(schema["enum"]))
    for combined in ("anyOf", "oneOf"):
        if schema.get(combined):
            return sample_schema(rng.choice(schema[combined]), rng, depth + 1, root)
    return _SAMPLERS.get(_kind(schema), _sample_string)(schema, rng, depth, root)


def _kind(schema: Mapping[str, Any]) -> str:
    """The JSON type to sample: the first non-null one listed, else what the keywords imply."""
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    return kind


def _sample_object(schema: Mapping[str, Any], rng: random.Random, depth: int,
                   root: Mapping[str, Any]) -> Any:
    """Every required property, and each optional one half the time."""
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    return {name: sample_schema(sub, rng, depth + 1, root)
            for name, sub in properties.items()
            if name in required or rng.random() < 0.5}


def _sample_array(schema: Mapping[str, Any], rng: random.Random, depth: int,
                  root: Mapping[str, Any]) -> Any:
    """Between ``minItems`` (default 1) and ``maxItems`` (default 3) items."""
    low = int(schema.get("minItems", 1))
    high = int(schema.get("maxItems", max(low, 3)))
    return [sample_schema(schema.get("items") or {}, rng, depth + 1, root)
            for _ in range(rng.randint(low, max(low, high)))]


def _sample_integer(schema: Mapping[str, Any], rng: random.Random, depth: int,
                    root: Mapping[str, Any]) -> Any:
    """Within ``minimum`` and ``maximum`` (default: the ten above the minimum)."""
    low = int(schema.get("minimum", 0))
    return rng.randint(low, int(schema.get("maximum", low + 10)))


def _sample_number(schema: Mapping[str, Any], rng: random.Random, depth: int,
                   root: Mapping[str, Any]) -> Any:
    """Within ``minimum`` and ``maximum`` (default: one above the minimum), 3 decimals."""
    low = float(schema.get("minimum", 0.0))
    return round(rng.uniform(low, float(schema.get("maximum", low + 1.0))), 3)


def _sample_boolean(schema: Mapping[str, Any], rng: random.Random, depth: int,
                    root: Mapping[str, Any]) -> Any:
    """True half the time."""
    return rng.random() < 0.5


def _sample_null(schema: Mapping[str, Any], rng: random.Random, depth: int,
                 root: Mapping[str, Any]) -> Any:
    """The only value there is."""
    return None


def _sample_string(schema: Mapping[str, Any], rng: random.Random, depth: int,
                   root: Mapping[str, Any]) -> Any:
    """One fixed word (a string, or a type the mock does not know)."""
    return "mock"


# How each JSON type is sampled (any other type gets a string).
_SAMPLERS = {"object": _sample_object, "array": _sample_array, "integer": _sample_integer,
             "number": _sample_number, "boolean": _sample_boolean, "null": _sample_null}


def _resolved(schema: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    """``schema`` with a local ``$ref`` (``#/$defs/Name``) and an ``allOf`` merged in."""
    merged = dict(schema)
    for _ in range(_MAX_DEPTH):  # a chain of references, not a cycle
        ref = merged.pop("$ref", None)
        if not isinstance(ref, str):
            break
        target = _ref_target(ref, root)
        if not isinstance(target, Mapping) or target is root:
            break  # a remote or broken reference: sampled as what the rest says
        merged = {**target, **merged}
    for part in merged.pop("allOf", None) or ():
        if isinstance(part, Mapping):
            merged = {**_resolved(part, root), **merged}
    return merged


def _ref_target(ref: str, root: Mapping[str, Any]) -> Any:
    """What a local ``$ref`` points to in ``root`` (``root`` itself for a remote one)."""
    target: Any = root
    for part in ref.removeprefix("#/").split("/") if ref.startswith("#/") else ():
        target = target.get(part) if isinstance(target, Mapping) else None
    return target


__all__ = ["TEXT_REPLY", "TEXT_REPLY_RATE", "mock_tool_reply", "sample_schema"]
