"""Calling the policy model: the OpenAI-compatible URL the trainer puts in `policy.config`.

Trainers append a correlation query (``?cid=...``) to ``inference_url``; it must survive
the path we add, or the trainer cannot match completions to rollouts.

Whoever holds the app's key chooses that URL, so the call is made as to a stranger: no
redirect is followed, link-local addresses are refused (`_outbound`), and what comes back
reaches the client only as a status and a host; an answer's body goes to the server's log,
truncated and with the request's secrets masked.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import httpx
from pydantic_core import to_json

from synth_deploy.env import known_secrets, redact, redact_userinfo
from synth_deploy.errors import BadRequest, TaskAppError
from synth_deploy.taskapp._outbound import (
    ALLOW_LINK_LOCAL_HINT,
    CREDENTIALS_CONFLICT,
    CREDENTIALS_HINT,
    AnswerTooLarge,
    OutboundClient,
    PolicyAnswer,
    is_link_local,
    refused_address,
)
from synth_deploy.taskapp._token_capture import capture_fields, reply_tokens, wants_tokens
from synth_deploy.taskapp.config import RolloutContext
from synth_deploy.taskapp.tools import ToolCall, assistant_message, parse_tool_calls

logger = logging.getLogger("synth_deploy.taskapp")
INFERENCE_URL_FIELD = "policy.config.inference_url"
LOGGED_BODY_CHARS = 500
MAX_ANSWER_BYTES = 16 * 2**20  # a chat completion is kilobytes; with logprobs, a few MB


class PolicyError(TaskAppError):
    """The policy endpoint could not be called or answered badly (the server answers 502).

    ``status``: the HTTP status it answered, None when it gave no answer (refused, reset,
    timed out: the network's failure). ``retryable``: whether the same call may succeed if
    sent again (no answer, 429, 5xx), as opposed to an answer that will not change (4xx, a
    body that is not a chat completion)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def answered(self) -> bool:
        return self.status is not None

    @property
    def retryable(self) -> bool:
        return self.status is None or self.status == 429 or self.status >= 500


@functools.lru_cache(maxsize=1024)  # every call of a run parses the same URL
def chat_completions_url(inference_url: str) -> str:
    """``{base}/chat/completions`` with the base's query (``?cid=``) kept; `BadRequest` when
    ``inference_url`` is not an http(s) URL."""
    try:
        parts = urlsplit(inference_url)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except (TypeError, ValueError, AttributeError):
        valid = False
    shown = redact_userinfo(repr(inference_url))[:120]
    if not valid:
        raise BadRequest(f"{INFERENCE_URL_FIELD} must be an http(s) URL, got {shown}",
                         code="invalid_inference_url", field=INFERENCE_URL_FIELD)
    path = parts.path.rstrip("/")
    if not path.endswith("/chat/completions"):
        path += "/chat/completions"
    url = urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))
    try:  # what httpx refuses to send to: an octal IPv4 address, full-width digits...
        httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise BadRequest(f"{INFERENCE_URL_FIELD} is not a URL the server can call ({exc}), "
                         f"got {shown}"[:300], code="invalid_inference_url",
                         field=INFERENCE_URL_FIELD) from None
    return url


@dataclass(frozen=True)
class PolicyReply:
    content: str
    tool_calls: list[dict[str, Any]]
    raw: dict[str, Any]
    latency_ms: float

    @property
    def message(self) -> dict[str, Any]:
        """The reply as the assistant turn to append to the conversation."""
        return assistant_message(self.raw["choices"][0]["message"])

    @property
    def calls(self) -> list[ToolCall]:
        """The tool calls, decoded (`ToolCall.error` says what could not be read)."""
        return parse_tool_calls({"tool_calls": self.tool_calls})


async def call_policy(
    ctx: RolloutContext, messages: list[dict[str, Any]], **params: Any
) -> PolicyReply:
    """One chat completion from the rollout's policy, recorded in ``ctx.tracer``."""
    config = ctx.request.policy.config
    inference_url = config.get("inference_url")
    if not inference_url:
        raise BadRequest(f"{INFERENCE_URL_FIELD} is missing from the rollout request",
                         code="missing_inference_url", field=INFERENCE_URL_FIELD,
                         hint="send the OpenAI-compatible base URL the app should call")
    body = _request_body(config, messages)
    body.update(params)
    plain = body
    capture = wants_tokens(config, ctx.config.capture_tokens)
    if capture:
        body = capture_fields(body)
    # Recorded as the bytes sent and answered (`record_exchange`): the caller's list grows
    # with later turns, and the record must show what this call sent.
    content = _json_bytes(body)
    headers = _request_headers(ctx, config)
    url = chat_completions_url(inference_url)
    started = time.perf_counter()
    resp, content, refused = await _post_asking_tokens(ctx, url, content, headers,
                                                        capture and body != plain, plain)
    if refused:
        body = plain
    latency_ms = (time.perf_counter() - started) * 1000
    data, message = _completion(ctx, url, resp)
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else None
    event = ctx.tracer.record_lm_call(model_name=data.get("model") or body["model"],
                                      provider=_host(url), usage=usage,
                                      latency_ms=round(latency_ms, 3),
                                      tokens=reply_tokens(data, refused) if capture else None)
    ctx.tracer.record_exchange(event, content, resp.content)
    content = message.get("content") or ""
    tool_calls = list(message.get("tool_calls") or [])
    return PolicyReply(content=content, tool_calls=tool_calls, raw=data,
                       latency_ms=latency_ms)


async def _post_asking_tokens(ctx: RolloutContext, url: str, content: bytes,
                              headers: dict[str, str], asked: bool, plain: dict[str, Any]
                              ) -> tuple[PolicyAnswer, bytes, bool]:
    """The answer, the bytes it answered, and whether the policy refused the token fields
    ``asked`` for: OpenAI and Groq refuse fields they do not know (400), so the call is made
    again without ours."""
    resp = await _post_with_retry(ctx.http, url, content, headers)
    if not (asked and resp.status_code == 400):
        return resp, content, False
    content = _json_bytes(plain)
    return await _post_with_retry(ctx.http, url, content, headers), content, True


def _request_body(config: dict[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat completion request: the model, the messages and the sampling settings the
    rollout's policy config gives (each checked: an error names the field)."""
    body: dict[str, Any] = {"model": config.get("model"), "messages": messages}
    if not isinstance(body["model"], str | None):
        raise BadRequest("policy.config.model must be a string (the model's name)",
                         code="invalid_policy_config", field="policy.config.model")
    for name in ("temperature", "max_tokens", "max_completion_tokens", "top_p"):
        if name in config:
            value = body[name] = config[name]
            if isinstance(value, float) and not math.isfinite(value):  # 1e400 reads as inf
                raise BadRequest(f"policy.config.{name} must be a finite number, got {value}",
                                 code="invalid_policy_config", field=f"policy.config.{name}")
    return body


def _request_headers(ctx: RolloutContext, config: dict[str, Any]) -> dict[str, str]:
    """The policy's key as a bearer token, and the rollout's trace context if it came with
    one."""
    headers = {}
    if api_key := config.get("api_key"):
        if not (isinstance(api_key, str) and api_key.isascii() and api_key.isprintable()):
            raise BadRequest("policy.config.api_key must be printable ASCII",
                             code="invalid_api_key_value", field="policy.config.api_key")
        headers["Authorization"] = f"Bearer {api_key}"
    if (parent := ctx.tracer.trace_parent) is not None:
        # The rollout came with W3C trace context: the policy's spans join that trace, as
        # children of the rollout's span.
        from synth_deploy.otel import rollout_span_id

        headers["traceparent"] = parent.child(rollout_span_id(ctx.tracer.session_id))
    return headers


def _completion(ctx: RolloutContext, url: str, resp: PolicyAnswer) -> tuple[Any, Any]:
    """The answer's JSON and its first choice's message; `PolicyError` (the answer logged)
    for a status other than 2xx or anything that is not an OpenAI chat completion."""
    if resp.status_code >= 300:
        _log_answer(ctx, url, resp)
        redirect = " (a redirect; redirects are not followed)" if resp.status_code < 400 else ""
        raise PolicyError(f"policy at {_origin(url)} answered HTTP {resp.status_code}{redirect}",
                          status=resp.status_code)
    try:
        data = resp.json()
        message = data["choices"][0]["message"]
        _check_completion(data, message)
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        _log_answer(ctx, url, resp)
        raise PolicyError(f"policy at {_origin(url)} answered HTTP {resp.status_code} with "
                          f"something that is not an OpenAI chat completion "
                          f"({resp.headers.get('content-type', 'no content type')}, "
                          f"{len(resp.content)} bytes{_why(exc)})",
                          status=resp.status_code) from exc
    return data, message


class _WrongShape(TypeError):
    """A field of a chat completion with a type OpenAI's API never gives it."""


def _check_completion(data: Any, message: Any) -> None:
    """`_WrongShape` naming the field, unless the parts the kit and the app read have the types
    OpenAI's API gives them: a policy URL is whatever a key holder chose, and a reply of the
    wrong shape must be the policy's failure (502), not the app's (500)."""
    if not isinstance(message, dict):
        raise _WrongShape("choices[0].message is not an object")
    for name, kinds in (("content", str), ("tool_calls", list)):
        value = message.get(name)
        if value is not None and not isinstance(value, kinds):
            raise _WrongShape(f"choices[0].message.{name} is {_json_type(value)}")
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise _WrongShape(f"model is {_json_type(model)}")


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
             int: "a number", float: "a number"}
    return names.get(type(value), type(value).__name__)


def _why(exc: Exception) -> str:
    return f"; {exc}" if isinstance(exc, _WrongShape) else ""


# A pooled keep-alive connection the server closed a moment ago fails before any answer
# (connection reset, "server disconnected"): sending again on a fresh connection is what every
# OpenAI client does. Timeouts are not retried: the policy may still be working.
POLICY_ATTEMPTS = 3


def _json_bytes(body: dict[str, Any]) -> bytes:
    """``body`` as compact UTF-8 JSON, as httpx's ``json=`` sends it (NaN and infinity
    refused). pydantic-core writes it: the stdlib's encoder without ``ensure_ascii`` is
    several times slower, and every turn of every episode sends one."""
    content = to_json(body)
    if b"NaN" in content or b"Infinity" in content:  # a float or only a string's text
        json.dumps(body, allow_nan=False)  # ValueError for the float, as httpx said it
    return content


async def _post_with_retry(client: OutboundClient, url: str, content: bytes,
                           headers: dict[str, str]) -> PolicyAnswer:
    """``content`` (JSON) POSTed through the app's session, the answer read whole (at most
    `MAX_ANSWER_BYTES`: whoever holds a key picks the policy URL, and must not make the
    server hold gigabytes)."""
    _check_one_credential(url, headers)
    headers = {"Content-Type": "application/json", **headers}
    for attempt in range(1, POLICY_ATTEMPTS + 1):
        try:
            return await client.post_capped(url, content, headers, max_bytes=MAX_ANSWER_BYTES)
        except AnswerTooLarge:
            raise PolicyError(f"policy at {_origin(url)} answered more than "
                              f"{MAX_ANSWER_BYTES // 2**20} MiB; the answer was not "
                              "read", status=200) from None
        except TimeoutError as exc:  # aiohttp's timeouts are connection errors too
            raise PolicyError(f"policy at {_origin(url)} did not answer: "
                              f"{_failure(exc)}") from exc
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            if (refused := refused_address(exc)) is not None:
                raise BadRequest(f"{INFERENCE_URL_FIELD}: {refused.host} resolves to the "
                                 f"link-local address {refused.address}; refused",
                                 code="refused_inference_url", field=INFERENCE_URL_FIELD,
                                 hint=ALLOW_LINK_LOCAL_HINT) from exc
            if attempt == POLICY_ATTEMPTS:
                raise PolicyError(f"policy at {_origin(url)} did not answer after "
                                  f"{attempt} attempts: {_failure(exc)}") from exc
            await asyncio.sleep(0.05 * attempt)
        except aiohttp.ClientError as exc:
            raise PolicyError(f"policy at {_origin(url)} did not answer: "
                              f"{_failure(exc)}") from exc
    raise AssertionError("unreachable")


def _check_one_credential(url: str, headers: dict[str, str]) -> None:
    """`BadRequest` when the URL carries user:password@ and an Authorization header is set
    too: both would go in the one header, and one of them would be dropped."""
    if "Authorization" in headers and "@" in url and urlsplit(url).username is not None:
        raise BadRequest(f"{INFERENCE_URL_FIELD} {CREDENTIALS_CONFLICT}",
                         code="conflicting_policy_credentials", field=INFERENCE_URL_FIELD,
                         hint=CREDENTIALS_HINT)


def _failure(exc: Exception) -> str:
    # httpx's transport messages are the OS's ("Connection refused"), never an answer's body.
    return f"{type(exc).__name__}: {str(exc)[:200]}" if str(exc) else type(exc).__name__


@functools.lru_cache(maxsize=1024)  # as `chat_completions_url`: a run calls one URL
def _host(url: str) -> str | None:
    return urlsplit(url).hostname


def _origin(url: str) -> str:
    """scheme://host[:port]: what a client may be told about where the policy is."""
    parts = urlsplit(url)
    host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
    return f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "")


def _log_answer(ctx: RolloutContext, url: str, resp: PolicyAnswer) -> None:
    """The policy's answer, for the operator: truncated, the request's secrets masked."""
    # At any depth and in the URL: an upstream may echo the query or the Basic credentials.
    secrets = known_secrets(ctx.request.policy.config)
    text = redact(redact_userinfo(resp.text[:LOGGED_BODY_CHARS]), secrets)
    logger.warning("rollout %s: policy at %s answered HTTP %d; first %d chars: %r",
                   ctx.request.run_id, _origin(url), resp.status_code, LOGGED_BODY_CHARS, text)


# The address rule the policy call follows, for a check beside it.
__all__ = ["PolicyError", "PolicyReply", "call_policy", "chat_completions_url", "is_link_local",
           "refused_address"]
