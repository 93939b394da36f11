"""Stand-in policy servers that return token data, for tests that cannot run vLLM here.

`vllm_policy` answers chat completions as vLLM's OpenAI-compatible server does (>= 0.10.2,
vllm/entrypoints/openai/protocol.py): with ``return_token_ids`` the response carries
``prompt_token_ids`` at its top level and ``choices[i].token_ids``; with ``logprobs`` each
choice has ``logprobs.content`` (``token``, ``logprob``, ``bytes``, ``top_logprobs``); with
neither, none of them (``prompt_logprobs`` and ``kv_transfer_params`` are null, as vLLM
sends them). Ids and log-probabilities come from the kit's byte-level toy tokenizer.

``re_render=True`` makes it a server whose chat template re-renders history, as Qwen3's
drops the reasoning of earlier assistant turns: each completion samples a
``<think>…</think>`` block (returned as ``reasoning_content``) that the next prompt no
longer holds, so the next turn's prompt does not begin with this turn's ids.

The replies come from a script, as `scripted_policy`'s do. ``app.state.sent`` keeps what
each answer held: ``(prompt_token_ids, token_ids, logprobs)``. ``alter(answer)``, when given,
changes each answer before it goes (a server that answers a field wrong). ``strict=True``
refuses any field OpenAI's API does not know, as OpenAI does (HTTP 400,
``invalid_request_error``, "Unrecognized request argument supplied: NAME"). ``encode(answer)``,
when given, writes each answer's bytes (a broken server's JSON: a bare ``NaN``, ``1e400``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from standins.scripted_policy import Reply
from synth_deploy.runs import ToyTokenizer as toy

THINKING = "<think>I should look around first.</think>"
# What OpenAI's chat completions accept (`strict`).
OPENAI_FIELDS = {"model", "messages", "tools", "tool_choice", "temperature", "top_p",
                 "max_tokens", "max_completion_tokens", "logprobs", "top_logprobs", "n",
                 "stop", "seed", "stream", "response_format", "parallel_tool_calls", "user"}


def vllm_policy(script: Sequence[Reply], *, re_render: bool = False,
                model: str = "Qwen/Qwen3-0.6B",
                alter: Callable[[dict[str, Any]], None] | None = None,
                strict: bool = False,
                encode: Callable[[dict[str, Any]], bytes] | None = None) -> Starlette:
    sent: list[tuple[list[int], list[int], list[float]]] = []
    requests: list[dict[str, Any]] = []

    async def completions(request: Request) -> JSONResponse:
        body = await request.json()
        requests.append(body)
        if strict and (unknown := sorted(set(body) - OPENAI_FIELDS)):
            return JSONResponse({"error": {
                "message": f"Unrecognized request argument supplied: {', '.join(unknown)}",
                "type": "invalid_request_error", "param": None, "code": None}}, 400)
        entry = script[min(len(sent) + 1, len(script)) - 1]
        reply = entry(body) if callable(entry) else entry
        message = {"role": "assistant", "content": reply} if isinstance(reply, str) \
            else dict(reply)
        prompt = toy.prompt_ids(body["messages"])  # history as the template renders it
        completion = toy.completion_ids(message)
        if re_render:  # sampled, then parsed out of the content by the reasoning parser
            completion = toy.text_ids(THINKING) + completion
            message["reasoning_content"] = THINKING[len("<think>"):-len("</think>")]
        logprobs = toy.logprobs(prompt, completion)
        sent.append((prompt, completion, logprobs))
        choice: dict[str, Any] = {
            "index": 0, "message": message, "logprobs": None,
            "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
            "stop_reason": None}
        answer: dict[str, Any] = {
            "id": f"chatcmpl-{len(requests)}", "object": "chat.completion",
            "created": int(time.time()), "model": body.get("model") or model,
            "choices": [choice], "service_tier": None, "system_fingerprint": None,
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(completion),
                      "total_tokens": len(prompt) + len(completion)},
            "prompt_logprobs": None, "kv_transfer_params": None}
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [
                {"token": _token(i), "logprob": lp, "bytes": list(_token(i).encode()),
                 "top_logprobs": []} for i, lp in zip(completion, logprobs, strict=True)]}
        if body.get("return_token_ids"):
            answer["prompt_token_ids"] = prompt
            choice["token_ids"] = completion
        if alter is not None:
            alter(answer)
        if encode is not None:
            return Response(encode(answer), media_type="application/json")
        return JSONResponse(answer)

    app = Starlette(routes=[Route("/{path:path}", completions, methods=["POST"])])
    app.state.sent = sent
    app.state.requests = requests
    return app


# What OpenAI's chat completions accept; it answers 400 to any other field.
OPENAI_FIELDS = {"model", "messages", "tools", "tool_choice", "temperature", "top_p",
                 "max_tokens", "max_completion_tokens", "logprobs", "top_logprobs", "n",
                 "stop", "seed", "stream", "response_format", "parallel_tool_calls", "user"}


def _token(token_id: int) -> str:
    return {toy.IM_START: "<|im_start|>", toy.IM_END: "<|im_end|>"}.get(
        token_id, chr(token_id) if token_id < 128 else f"\\x{token_id:02x}")
