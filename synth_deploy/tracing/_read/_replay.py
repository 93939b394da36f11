"""A stored session read back as an episode: what each timestep added, as plain text.

Every policy call is recorded with the whole conversation it was shown, so in a multi-turn
episode each timestep repeats the turns before it. `replay` yields, per timestep, only the
messages no earlier timestep held (and how many it repeated); `message_text` renders a
message for a terminal: tool calls as ``name(arguments)``, image parts as a short tag instead
of a data URL.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from synth_deploy.tracing._session import Message, SessionTrace, Timestep


@dataclass(frozen=True)
class ReplayStep:
    """One timestep of a replay: its new messages and the count of repeated ones."""

    step: Timestep
    messages: list[Message]
    repeated: int


def replay(trace: SessionTrace) -> Iterator[ReplayStep]:
    seen: set[str] = set()
    for step in trace.timesteps:
        new, repeated = [], 0
        for message in step.messages:
            key = _identity(message)
            if key in seen:
                repeated += 1
            else:
                seen.add(key)
                new.append(message)
        yield ReplayStep(step, new, repeated)


def message_text(message: Message) -> str:
    """The message as text: its content (images as ``[image …]``) and its tool calls."""
    parts = []
    text = content_text(message.content)
    if text:
        parts.append(text)
    for call in message.metadata.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            parts.append(f"→ {function.get('name')}({function.get('arguments') or ''})")
    if message.metadata.get("tool_call_id"):
        parts.insert(0, f"[{message.metadata['tool_call_id']}]")
    return " ".join(parts) if len(parts) > 1 and "\n" not in parts[0] else "\n".join(parts)


def content_text(content: Any, *, with_images: bool = True) -> str:
    """Text of a message content: a string, or OpenAI content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces = []
        for part in content:
            if not isinstance(part, dict):
                pieces.append(str(part))
            elif part.get("type") == "text":
                pieces.append(str(part.get("text") or ""))
            elif part.get("type") in ("image_url", "input_image") and with_images:
                pieces.append(_image_tag(part))
        return "\n".join(p for p in pieces if p)
    return json.dumps(content, ensure_ascii=False, default=str)


def _image_tag(part: dict[str, Any]) -> str:
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    if isinstance(url, str) and url.startswith("data:"):
        media, _, data = url[5:].partition(",")
        return f"[image {media.split(';')[0] or 'data'}, {len(data) * 3 // 4 / 1024:.1f} KB]"
    return f"[image {url}]"


def _identity(message: Message) -> str:
    # Text without images: a later turn shows an earlier observation as text only.
    return json.dumps([message.message_type, content_text(message.content, with_images=False),
                       message.metadata.get("tool_calls"), message.metadata.get("tool_call_id")],
                      sort_keys=True, default=str)


__all__ = ["ReplayStep", "content_text", "message_text", "replay"]
