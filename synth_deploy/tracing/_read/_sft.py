"""An SFT example: what one policy call of a rollout teaches, in the format synth-ai's SFT
reader takes (shared/spec/configs.md), and the one rule for which calls make one.

An example is one timestep's policy call: the chat it recorded (the system and user
prompts, any earlier turns it was shown) up to and including the assistant's last reply,
the tools the call offered, and metadata naming the rollout (session, app, run, seed,
model, turn, step, reward, cost ledger). A timestep makes no example when:

- it holds no reply, or nothing before the reply (its rollout made no policy call, or
  recorded no chat): `NO_REPLY`;
- its reply answers a prompt with text although the call offered tools, calling none: a
  turn the environment could not play, not one to train on (`TEXT_FOR_TOOLS`). A text
  reply to a tool's result (the answer after the tools were used) is an example.

Tools are written flat, ``{"name", "description"?, "parameters"?}``: synth-ai's reader
refuses OpenAI's nested ``{"type": "function", "function": {...}}`` ("tool 0 missing
name"); `flat_tools` turns a list into that form.

`sft_examples` reads a `SessionTrace` in memory; the export (`_export`) reads the same
`Rollout` and `Turn` values from the store's rows, a page of sessions at a time. Both go
through `examples`, so a stored session and the same session in memory give the same lines.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from synth_deploy.tracing._ledger import ledger_of
from synth_deploy.tracing._session import SessionTrace, Timestep, session_reward

# Recorded message types -> chat roles; other types (tool_use) are not chat.
ROLES = {"system": "system", "user": "user", "assistant": "assistant",
         "tool_result": "tool", "tool": "tool"}
_CHAT_FIELDS = ("tool_calls", "tool_call_id", "name")
NO_REPLY = "no_reply"
TEXT_FOR_TOOLS = "text_instead_of_tool_call"


@dataclass(slots=True)
class Rollout:
    """What every example of one session carries in its metadata."""

    session_id: str
    app_id: Any = None
    run_id: Any = None
    seed: Any = None
    model: Any = None
    reward: float | None = None
    ledger: dict[str, Any] | None = None  # `CostLedger.to_dict()`
    reward_version: str | None = None  # whose reward ``reward`` is (None: the recorded one)


@dataclass(slots=True)
class Turn:
    """One timestep's policy call: its chat (`chat_message`s, in order) and the tools the
    call offered (flat; None where it offered none)."""

    step_id: Any
    turn: int | None
    chat: list[dict[str, Any]]
    tools: list[Any] | None = None


def examples(rollout: Rollout, turns: Iterable[Turn],
             skipped: Counter[str] | None = None) -> Iterator[dict[str, Any]]:
    """The examples ``turns`` make; ``skipped`` counts the others, by reason."""
    for turn in turns:
        target = _target(turn)
        if isinstance(target, str):
            if skipped is not None:
                skipped[target] += 1
            continue
        chat = turn.chat
        example: dict[str, Any] = {"messages": chat if target == len(chat) - 1
                                   else chat[:target + 1]}
        if turn.tools:
            example["tools"] = turn.tools
        example["metadata"] = {
            "session_id": rollout.session_id, "app_id": rollout.app_id,
            "run_id": rollout.run_id, "seed": rollout.seed, "model": rollout.model,
            "turn": turn.turn, "step_id": turn.step_id, "reward": rollout.reward}
        if rollout.reward_version is not None:
            example["metadata"]["reward_version"] = rollout.reward_version
        if rollout.ledger is not None:
            example["metadata"]["ledger"] = rollout.ledger
        yield example


def _target(turn: Turn) -> int | str:
    """The index of the reply the turn teaches, or why it teaches none."""
    chat = turn.chat
    last = len(chat) - 1
    while last >= 0 and chat[last]["role"] != "assistant":
        last -= 1
    if last < 1 or not any(message["role"] != "assistant" for message in chat[:last]):
        return NO_REPLY
    if turn.tools and not chat[last].get("tool_calls") and chat[last - 1]["role"] != "tool":
        return TEXT_FOR_TOOLS
    return last


def sft_examples(session: SessionTrace) -> Iterator[dict[str, Any]]:
    """The SFT examples in one session (see the module docstring)."""
    meta = session.metadata
    rollout = Rollout(session.session_id, meta.get("app_id"), meta.get("run_id"),
                      meta.get("seed"), meta.get("model"), session_reward(session),
                      ledger_of(session).to_dict())
    return examples(rollout, (
        Turn(step.step_id, step.turn_number,
             [chat_message(m.message_type, m.content, m.metadata) for m in step.messages
              if m.message_type in ROLES], tools_offered(step))
        for step in session.timesteps))


def chat_message(message_type: str, content: Any, metadata: dict[str, Any]) -> dict[str, Any]:
    """A recorded message as an OpenAI chat message, tool calls and tool call ids included
    (``message_type`` one of `ROLES`)."""
    if not isinstance(content, str | list | dict) and content is not None:
        content = str(content)  # a number or bytes, as another writer may have stored it
    out = {"role": ROLES[message_type], "content": content}
    if metadata:
        for name in _CHAT_FIELDS:
            if metadata.get(name):
                out[name] = metadata[name]
    return out


def tools_offered(step: Timestep) -> list[Any] | None:
    """The tools the step's last policy call offered (what the reply's tool calls refer to),
    flat; None where it offered none."""
    for event in reversed(step.events):
        for record in reversed(event.call_records or []):
            request = record.get("request") if isinstance(record, dict) else None
            if isinstance(request, dict) and isinstance(request.get("tools"), list):
                return flat_tools(request["tools"])
    return None


def flat_tools(tools: Any) -> Any:
    """``tools`` with every OpenAI nested definition flattened (``type`` kept); anything
    else, including a value that is not a list, comes back as it was."""
    if not isinstance(tools, list):
        return tools
    return [_flat(tool) for tool in tools]


def _flat(tool: Any) -> Any:
    if isinstance(tool, dict) and "name" not in tool and isinstance(tool.get("function"), dict):
        rest = {k: v for k, v in tool.items() if k != "function"}
        return {**rest, **tool["function"]}
    return tool


__all__ = ["NO_REPLY", "ROLES", "TEXT_FOR_TOOLS", "Rollout", "Turn", "chat_message",
           "examples", "flat_tools", "sft_examples", "tools_offered"]
