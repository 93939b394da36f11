"""The built-in mock policy: an OpenAI-compatible chat completions server for smoke runs.

It answers any ``POST …/chat/completions`` (so ``http://host:port/v1`` works as an
``inference_url``, with or without ``?cid=``), and ``GET …/models`` with its one model. It
is a deterministic "noisy solver": when the last user message holds an arithmetic expression
it evaluates it and answers ``Answer: N``, wrong on purpose for about one prompt in six;
otherwise it guesses from the numbers it sees. Rewards through it are therefore mixed, like
a real small model's, and the same prompt always gets the same answer.

Asked to sample (``temperature`` > 0, as a trainer does), it answers like a sampled model
instead: each prompt has its own difficulty, and each sample is wrong with a probability that
grows with it, so the members of a GRPO group (same prompt, different samples) disagree on
some prompts and agree on the easy ones. A sample is keyed by the trainer's correlation id
(``?cid=``): the same prompt and cid always get the same answer; without a cid it is random.

Asked to write a function (a ``def name(args):`` whose docstring says ``Return `EXPR`.``, as
``apps/code`` asks), it answers the function returning that expression in a ```python block,
missing any edge case the docstring adds (so some hidden tests fail) and wrong on purpose
for about one prompt in six, as with arithmetic.

Offered ``tools``, it calls one with arguments valid for the tool's schema (see `_mock_tools`),
so a multi-turn tool-calling environment plays through it with no model at all.

Asked for token data as vLLM is (``return_token_ids``, ``logprobs``), it answers in vLLM's
shape with the ids of a byte-level toy tokenizer and deterministic log-probabilities (see
`_toy_tokenizer`): token capture, continuity checks and the token export run without a GPU.
"""

from __future__ import annotations

import ast
import hashlib
import json
import operator
import re
import secrets
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from synth_deploy.runs import _toy_tokenizer as toy
from synth_deploy.runs._mock_tools import mock_tool_reply

MOCK_MODEL = "synth-deploy/mock-policy"
_EXPRESSION = re.compile(r"-?\d+(?:\s*[-+*/]\s*-?\d+)+")
# A function to write: its signature, then a docstring opening with what it returns.
_FUNCTION_ASKED = re.compile(r'def (\w+)\(([^)]*)\):\s*\n\s*"""Return `([^`\n]+)`')
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


def _unit(text: str) -> float:
    """A number in [0, 1) that ``text`` always maps to."""
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) % 1000 / 1000


def mock_answer(prompt: str, *, error_rate: float = 1 / 6, temperature: float = 0.0,
                sample: str | None = None) -> str:
    """The mock policy's reply to ``prompt``: deterministic at temperature 0; above it, a
    sample keyed by ``sample`` (random when None)."""
    digest = int(hashlib.sha256(prompt.encode()).hexdigest()[:8], 16)
    unlucky = (digest % 1000) / 1000 < error_rate
    if temperature > 0:
        # The prompt's own difficulty, scaled by how freely the model samples.
        wrong_probability = min(0.9, temperature) * _unit("difficulty:" + prompt)
        draw = _unit(f"{sample}:{prompt}") if sample else secrets.randbelow(1000) / 1000
        unlucky = draw < wrong_probability
    if (function := _FUNCTION_ASKED.search(prompt)) is not None:
        name, params, expression = function.groups()
        if unlucky:
            expression = f"-({expression})"
        return (f"Here is the function.\n```python\ndef {name}({params}):\n"
                f"    return {expression}\n```")
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
    temperature = body.get("temperature")
    temperature = float(temperature) if isinstance(temperature, int | float) else 0.0
    if isinstance(body.get("tools"), list) and body["tools"]:
        message = mock_tool_reply(messages, body["tools"], tool_choice=body.get("tool_choice"),
                                  sample=cid if temperature > 0 else None)
    else:
        message = {"role": "assistant",
                   "content": mock_answer(prompt, sample=cid, temperature=temperature)}
    prompt_ids = toy.prompt_ids(messages)
    completion_ids = toy.completion_ids(message)
    top, choice = toy.vllm_fields(body, prompt_ids, completion_ids)
    return JSONResponse({
        "id": f"chatcmpl-mock-{state.requests}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model") or MOCK_MODEL,
        "choices": [{"index": 0, "message": message, **choice,
                     "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
        "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(completion_ids),
                  "total_tokens": len(prompt_ids) + len(completion_ids)},
        **top,
    })


_STARTED = int(time.time())


async def _models(request: Request) -> JSONResponse:
    """OpenAI's ``GET …/models`` (which OpenAI clients ask first) and ``…/models/{id}``:
    the one model it serves."""
    model = {"id": MOCK_MODEL, "object": "model", "created": _STARTED,
             "owned_by": "synth-deploy"}
    path = request.url.path.rstrip("/")
    if path.endswith("/models"):
        return JSONResponse({"object": "list", "data": [model]})
    if path.endswith(f"/models/{MOCK_MODEL}"):
        return JSONResponse(model)
    return JSONResponse({"error": {"message": f"no such route or model: GET {path} (the mock "
                                              f"policy serves {MOCK_MODEL})",
                                   "type": "invalid_request_error"}}, status_code=404)


def create_mock_policy_app() -> Any:
    """A Starlette app serving the mock policy; ``app.state.requests`` counts calls."""
    app = Starlette(routes=[Route("/{path:path}", _chat_completions, methods=["POST"]),
                            Route("/{path:path}", _models, methods=["GET"])])
    app.state.requests = 0
    app.state.correlation_ids = []
    return app


__all__ = ["MOCK_MODEL", "create_mock_policy_app", "mock_answer"]
