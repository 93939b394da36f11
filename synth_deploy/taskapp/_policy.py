"""Calling the policy model: the OpenAI-compatible URL the trainer puts in `policy.config`.

Trainers append a correlation query (``?cid=...``) to ``inference_url``; it must survive
the path we add, or the trainer cannot match completions to rollouts.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from synth_deploy.errors import TaskAppError
from synth_deploy.taskapp._config import RolloutContext


class PolicyError(TaskAppError):
    """The policy endpoint could not be called or answered badly."""


def chat_completions_url(inference_url: str) -> str:
    """``{base}/chat/completions`` with the base's query (``?cid=``) kept."""
    parts = urlsplit(inference_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise PolicyError(f"policy inference_url must be an http(s) URL, got {inference_url!r}")
    path = parts.path.rstrip("/")
    if not path.endswith("/chat/completions"):
        path += "/chat/completions"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


@dataclass(frozen=True)
class PolicyReply:
    content: str
    tool_calls: list[dict[str, Any]]
    raw: dict[str, Any]
    latency_ms: float


async def call_policy(
    ctx: RolloutContext, messages: list[dict[str, Any]], **params: Any
) -> PolicyReply:
    """One chat completion from the rollout's policy, recorded in ``ctx.tracer``."""
    config = ctx.request.policy.config
    inference_url = config.get("inference_url")
    if not inference_url:
        raise PolicyError("policy.config.inference_url is missing from the rollout request")
    body: dict[str, Any] = {"model": config.get("model"), "messages": messages}
    for name in ("temperature", "max_tokens", "max_completion_tokens", "top_p"):
        if name in config:
            body[name] = config[name]
    body.update(params)
    headers = {}
    if api_key := config.get("api_key"):
        headers["Authorization"] = f"Bearer {api_key}"
    url = chat_completions_url(inference_url)
    started = time.perf_counter()
    resp = await _post_with_retry(ctx.http, url, body, headers)
    latency_ms = (time.perf_counter() - started) * 1000
    if resp.status_code >= 400:
        raise PolicyError(f"policy at {_without_query(url)} answered HTTP {resp.status_code}: "
                          f"{resp.text[:300]}")
    try:
        data = resp.json()
        message = data["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise PolicyError("policy answer is not an OpenAI chat completion: "
                          f"{resp.text[:300]}") from exc
    usage = data.get("usage") or {}
    for m in messages:
        ctx.tracer.record_message(m.get("role", "user"), m.get("content"))
    ctx.tracer.record_lm_call(model_name=data.get("model") or body["model"],
                              provider=urlsplit(url).hostname,
                              input_tokens=usage.get("prompt_tokens"),
                              output_tokens=usage.get("completion_tokens"),
                              latency_ms=round(latency_ms, 3),
                              call_records=[{"request": body, "response": message}])
    content = message.get("content") or ""
    ctx.tracer.record_message("assistant", content)
    return PolicyReply(content=content, tool_calls=list(message.get("tool_calls") or []),
                       raw=data, latency_ms=latency_ms)


# A pooled keep-alive connection the server closed a moment ago fails before any answer
# (connection reset, "server disconnected"): sending again on a fresh connection is what every
# OpenAI client does. Timeouts are not retried: the policy may still be working.
_TRANSIENT = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
POLICY_ATTEMPTS = 3


async def _post_with_retry(client: httpx.AsyncClient, url: str, body: dict[str, Any],
                           headers: dict[str, str]) -> httpx.Response:
    for attempt in range(1, POLICY_ATTEMPTS + 1):
        try:
            return await client.post(url, json=body, headers=headers)
        except _TRANSIENT as exc:
            if attempt == POLICY_ATTEMPTS:
                raise PolicyError(f"policy at {_without_query(url)} did not answer after "
                                  f"{attempt} attempts: {type(exc).__name__}: {exc}") from exc
            await asyncio.sleep(0.05 * attempt)
        except httpx.HTTPError as exc:
            raise PolicyError(f"policy at {_without_query(url)} did not answer: "
                              f"{type(exc).__name__}: {exc}") from exc
    raise AssertionError("unreachable")


def _without_query(url: str) -> str:
    return url.split("?", 1)[0]


__all__ = ["PolicyError", "PolicyReply", "call_policy", "chat_completions_url"]
