"""Tool calling and multimodal messages in a rollout's conversation (OpenAI chat format).

    TOOL = function_tool("interact", "Take actions in the game.", {...JSON schema...})
    reply = await call_policy(ctx, messages, tools=[TOOL])
    for call in reply.calls:                  # parsed: name, decoded arguments or the error
        ...
    messages += [reply.message, tool_message(call.id, "done")]

    {"role": "user", "content": [text_part(observation), image_part(png_data_url(png))]}

Images travel as data URLs in OpenAI image parts, so a vision model reads them and the trace
store keeps them in the message content, where a viewer can show them.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def function_tool(name: str, description: str, parameters: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI ``tools`` entry: a function ``name`` taking a JSON-schema ``parameters``."""
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": dict(parameters)}}


@dataclass(frozen=True)
class ToolCall:
    """One tool call of an assistant message.

    ``arguments`` is the decoded JSON object, or None when the model sent something else;
    ``error`` then says what was wrong (for the message that tells the model).
    """

    id: str
    name: str
    arguments: dict[str, Any] | None
    raw_arguments: str
    error: str | None = None


def parse_tool_calls(message: Mapping[str, Any]) -> list[ToolCall]:
    """The tool calls of an assistant ``message``, each decoded as far as it goes."""
    calls = []
    for index, raw in enumerate(message.get("tool_calls") or []):
        if not isinstance(raw, Mapping):
            calls.append(ToolCall(f"call_{index}", "", None, json.dumps(raw, default=str),
                                  f"tool call {index} is not an object"))
            continue
        call_id = str(raw.get("id") or f"call_{index}")
        function = raw.get("function")
        if not isinstance(function, Mapping):
            calls.append(ToolCall(call_id, "", None, "", f"tool call {index} has no function"))
            continue
        name = str(function.get("name") or "")
        arguments = function.get("arguments")
        if isinstance(arguments, Mapping):  # some servers send the object, not its JSON
            calls.append(ToolCall(call_id, name, dict(arguments), json.dumps(arguments)))
            continue
        text = arguments if isinstance(arguments, str) else ""
        try:
            decoded = json.loads(text) if text.strip() else {}
        except json.JSONDecodeError as exc:
            calls.append(ToolCall(call_id, name, None, text,
                                  f"arguments are not valid JSON ({exc.msg} at column "
                                  f"{exc.colno})"))
            continue
        except RecursionError:  # a model's text, so no bound on how deep it nests
            calls.append(ToolCall(call_id, name, None, text,
                                  "arguments nest too deeply to decode"))
            continue
        if not isinstance(decoded, dict):
            calls.append(ToolCall(call_id, name, None, text,
                                  f"arguments must be a JSON object, got {type(decoded).__name__}"))
            continue
        calls.append(ToolCall(call_id, name, decoded, text))
    return calls


def assistant_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """The assistant turn to put back into the conversation: content and tool calls only
    (providers add fields such as ``refusal`` or ``reasoning`` that a request must not carry)."""
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        out["tool_calls"] = list(message["tool_calls"])
    return out


def tool_message(call_id: str, content: str) -> dict[str, Any]:
    """The tool result answering the call ``call_id`` (every call needs one before the
    conversation may go on)."""
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def image_part(url: str, *, detail: str | None = None) -> dict[str, Any]:
    """An image content part; ``url`` is an https URL or a data URL (`png_data_url`)."""
    image: dict[str, Any] = {"url": url}
    if detail:
        image["detail"] = detail
    return {"type": "image_url", "image_url": image}


def png_data_url(png: bytes) -> str:
    """``data:image/png;base64,...`` for PNG bytes."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


__all__ = ["ToolCall", "assistant_message", "function_tool", "image_part", "parse_tool_calls",
           "png_data_url", "text_part", "tool_message"]
