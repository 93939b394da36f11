"""A stand-in policy model: an OpenAI-compatible chat completions server that answers from a
script, for tests that need exact replies (a tool call with given actions, a reply without a
call, malformed arguments). Serve it with the `serve` fixture (real uvicorn on 127.0.0.1).

    policy = serve(scripted_policy([interact("move_left", "do"), "no tool call here"]))
    ... policy.url + "/v1" as the inference_url; policy.app.state.requests: the bodies received

A script entry is a string (a reply without tool calls), a message dict (sent as is) or a
callable taking the request body and returning either. Past the end, the last entry repeats.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

Reply = str | dict[str, Any] | Callable[[dict[str, Any]], "str | dict[str, Any]"]
_ids = itertools.count(1)


def tool_call(name: str, arguments: Any, call_id: str | None = None) -> dict[str, Any]:
    """One OpenAI tool call; ``arguments`` is JSON-encoded unless it is already a string."""
    return {"id": call_id or f"call_{next(_ids)}", "type": "function",
            "function": {"name": name, "arguments": arguments if isinstance(arguments, str)
                         else json.dumps(arguments)}}


def calls(*tool_calls: dict[str, Any], content: str | None = None) -> dict[str, Any]:
    """An assistant message making ``tool_calls``."""
    return {"role": "assistant", "content": content, "tool_calls": list(tool_calls)}


def interact(*actions: str) -> dict[str, Any]:
    """An assistant message calling crafter's ``interact`` tool with ``actions``."""
    return calls(tool_call("interact", {"actions": list(actions)}))


def scripted_policy(script: Sequence[Reply]) -> Starlette:
    requests: list[dict[str, Any]] = []

    async def completions(request: Request) -> JSONResponse:
        body = await request.json()
        requests.append(body)
        entry = script[min(len(requests), len(script)) - 1]
        reply = entry(body) if callable(entry) else entry
        message = {"role": "assistant", "content": reply} if isinstance(reply, str) else reply
        return JSONResponse({
            "id": f"chatcmpl-scripted-{len(requests)}", "object": "chat.completion",
            "model": body.get("model") or "scripted",
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})

    app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])
    app.state.requests = requests
    return app
