"""The built-in mock policy: an OpenAI-compatible chat completions server for smoke runs.

It answers any ``POST …/chat/completions`` (so ``http://host:port/v1`` works as an
``inference_url``, with or without ``?cid=``). It is a deterministic "noisy solver": when the
last user message holds an arithmetic expression it evaluates it and answers
``Answer: N``, wrong on purpose for about one prompt in six; otherwise it guesses from the
numbers it sees. Rewards through it are therefore mixed, like a real small model's, and the
same prompt always gets the same answer.
"""

from __future__ import annotations

import ast
import hashlib
import json
import operator
import re
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

MOCK_MODEL = "synth-deploy/mock-policy"
_EXPRESSION = re.compile(r"-?\d+(?:\s*[-+*/]\s*-?\d+)+")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.FloorDiv: operator.floordiv, ast.Div: operator.floordiv}


def _evaluate(expression: str) -> int | None:
    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError("unsupported expression")

    try:
        return walk(ast.parse(expression, mode="eval").body)
    except (ValueError, SyntaxError, ZeroDivisionError):
        return None


def mock_answer(prompt: str, *, error_rate: float = 1 / 6) -> str:
    """The mock policy's reply to ``prompt`` (deterministic)."""
    digest = int(hashlib.sha256(prompt.encode()).hexdigest()[:8], 16)
    unlucky = (digest % 1000) / 1000 < error_rate
    match = _EXPRESSION.search(prompt)
    value = _evaluate(match.group(0)) if match else None
    if value is None:
        numbers = [int(n) for n in re.findall(r"-?\d+", prompt)]
        value = sum(numbers) if numbers else 0
    if unlucky:
        value += 1 + digest % 7
    return f"Working it out step by step.\nAnswer: {value}"


async def _chat_completions(request: Request) -> JSONResponse:
    if not request.url.path.rstrip("/").endswith("chat/completions"):
        return JSONResponse({"error": {"message": f"no route {request.url.path}"}}, 404)
    try:
        body = json.loads(await request.body())
        messages = body["messages"]
        prompt = next(str(m.get("content") or "") for m in reversed(messages)
                      if m.get("role") == "user")
    except (ValueError, KeyError, TypeError, StopIteration):
        return JSONResponse({"error": {"message": "expected an OpenAI chat completions body "
                                       "with at least one user message", "type":
                                       "invalid_request_error"}}, 400)
    state = request.app.state
    state.requests += 1
    if cid := request.query_params.get("cid"):
        state.correlation_ids.append(cid)
    content = mock_answer(prompt)
    prompt_tokens = sum(len(str(m.get("content") or "").split()) for m in messages)
    completion_tokens = len(content.split())
    return JSONResponse({
        "id": f"chatcmpl-mock-{state.requests}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model") or MOCK_MODEL,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    })


def create_mock_policy_app() -> Any:
    """A Starlette app serving the mock policy; ``app.state.requests`` counts calls."""
    app = Starlette(routes=[Route("/{path:path}", _chat_completions, methods=["POST"])])
    app.state.requests = 0
    app.state.correlation_ids = []
    return app


__all__ = ["MOCK_MODEL", "create_mock_policy_app", "mock_answer"]
