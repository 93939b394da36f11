"""The mock policy's tokenizer and chat template: byte-level, so token data needs no model.

Ids 0-255 are the UTF-8 bytes of text; `IM_START` (256) and `IM_END` (257) frame messages.
A message renders as ``<|im_start|>{role}\\n{text}<|im_end|>\\n``, where an assistant's text
is its content followed by its tool calls as compact JSON (``[{"name", "arguments"}]``,
sorted keys); any other non-text content is compact JSON too. A prompt is the conversation
rendered, then ``<|im_start|>assistant\\n``; a completion is the reply's text then
``<|im_end|>``. So each turn's prompt begins with the previous turn's prompt and completion
(the newline after ``<|im_end|>`` belongs to the next prompt), as a template that never
re-renders history gives.

Log-probabilities are deterministic: the completion's i-th id gets ``-k/256`` with ``k`` in
1..256 drawn from a hash of the prompt and ``i`` (exact in float32, as the store keeps them).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

IM_START, IM_END = 256, 257
VOCAB_SIZE = 258


def text_ids(text: str) -> list[int]:
    return list(text.encode())


def message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    text = content if isinstance(content, str) else "" if content is None else _compact(content)
    calls = message.get("tool_calls")
    if message.get("role") == "assistant" and isinstance(calls, list) and calls:
        text += _compact([{"name": (c.get("function") or {}).get("name"),
                           "arguments": (c.get("function") or {}).get("arguments")}
                          for c in calls if isinstance(c, dict)])
    return text


def prompt_ids(messages: list[dict[str, Any]]) -> list[int]:
    """The conversation rendered, ending with the assistant's generation prompt."""
    ids: list[int] = []
    for m in messages:
        ids += [IM_START, *text_ids(f"{m.get('role', 'user')}\n{message_text(m)}"), IM_END,
                *text_ids("\n")]
    return ids + [IM_START, *text_ids("assistant\n")]


def completion_ids(reply: dict[str, Any]) -> list[int]:
    """The ids the policy samples for the assistant message ``reply``."""
    return [*text_ids(message_text({**reply, "role": "assistant"})), IM_END]


def logprobs(prompt: list[int], completion: list[int]) -> list[float]:
    seed = hashlib.sha256(bytes(str(prompt), "ascii")).digest()
    return [-(1 + hashlib.sha256(seed + i.to_bytes(4, "little")).digest()[0]) / 256
            for i in range(len(completion))]


def token_text(token_id: int) -> str:
    """How vLLM's logprobs name a token: its text (a lone byte as ``\\xNN`` text)."""
    if token_id == IM_START:
        return "<|im_start|>"
    if token_id == IM_END:
        return "<|im_end|>"
    return chr(token_id) if token_id < 128 else f"\\x{token_id:02x}"


def vllm_fields(body: dict[str, Any], prompt: list[int], completion: list[int]
                ) -> tuple[dict[str, Any], dict[str, Any]]:
    """What vLLM adds to a chat completion (top level, then ``choices[0]``) for the token
    fields ``body`` asks for: ``return_token_ids``, ``logprobs``, ``top_logprobs``,
    ``return_tokens_as_token_ids``."""
    top: dict[str, Any] = {}
    choice: dict[str, Any] = {"logprobs": None}
    if body.get("return_token_ids"):
        top["prompt_token_ids"] = prompt
        choice["token_ids"] = completion
    if body.get("logprobs"):
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        top_n = body.get("top_logprobs") if isinstance(body.get("top_logprobs"), int) else 0
        entries = []
        for token_id, value in zip(completion, logprobs(prompt, completion), strict=True):
            name = f"token_id:{token_id}" if as_ids else token_text(token_id)
            entries.append({"token": name, "logprob": value,
                            "bytes": list(name.encode()),
                            "top_logprobs": [{"token": name, "logprob": value,
                                              "bytes": list(name.encode())}][:top_n]})
        choice["logprobs"] = {"content": entries}
    return top, choice


class ToyTokenizer:
    """This module's functions under one name (what `synth_deploy.runs` exports)."""

    IM_START, IM_END, VOCAB_SIZE = IM_START, IM_END, VOCAB_SIZE
    prompt_ids = staticmethod(prompt_ids)
    completion_ids = staticmethod(completion_ids)
    logprobs = staticmethod(logprobs)
    message_text = staticmethod(message_text)
    text_ids = staticmethod(text_ids)
    vllm_fields = staticmethod(vllm_fields)


def _compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


__all__ = ["IM_END", "IM_START", "VOCAB_SIZE", "ToyTokenizer", "completion_ids", "logprobs",
           "message_text", "prompt_ids", "text_ids", "token_text", "vllm_fields"]
