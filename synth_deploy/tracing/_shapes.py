"""Every trace shape a task app returns as ``RolloutResponse.trace`` → one `SessionTrace`.

synth-ai 0.4.x task apps return, depending on their version and helpers:

- the v3 session, ``SessionTrace.to_dict()`` (``session_id``, ``session_time_steps`` with
  events that carry a ``time_record`` and no ``event_type``, messages whose content is
  ``{text, json_payload}``, ISO timestamps);
- ``build_trace_payload``'s trace (``trace_correlation_helpers``): only ``event_history`` of
  ``lm_call`` events (``llm_request``/``llm_response``), the ``session_id`` under
  ``metadata``;
- either of those wrapped as ``{"session_trace": {...}, "metadata": {...}}``;

and our own servers return `SessionTrace.to_dict()`. Whatever is missing is derived (event
kinds from their fields, timesteps from ``metadata.step_id``, messages from an LM call's
request and reply, ids from the session id and position, so storing a trace twice stores the
same rows); what cannot be read raises `TraceFormatError`.
"""

from __future__ import annotations

import json
import time
from dataclasses import fields
from typing import Any

from synth_deploy.tracing._errors import TraceFormatError
from synth_deploy.tracing._session import (
    Event,
    EventReward,
    Message,
    OutcomeReward,
    SessionTrace,
    Timestep,
    token_count,
    usage_from_counts,
)
from synth_deploy.tracing._times import epoch
from synth_deploy.tracing._tokens import TurnTokens

_EVENT_KINDS = ("cais", "environment", "runtime")
_LM_CALL_KINDS = ("lm_call", "llm_call", "lm", "llm")
_LM_FIELDS = ("model_name", "call_records", "llm_request", "llm_response", "usage",
              "input_tokens")
_ENV_FIELDS = ("reward", "terminated", "truncated")


def session_from_trace(trace: Any, *, session_id: str | None = None) -> SessionTrace:
    """Read ``trace`` (any shape above) as a `SessionTrace`.

    ``session_id`` is used when the trace names none (a run id, say). Raises
    `TraceFormatError` saying what is wrong when the trace cannot be read at all.
    """
    if not isinstance(trace, dict):
        raise TraceFormatError(f"the trace is {type(trace).__name__}, not a JSON object")
    try:
        return _session(trace, session_id)
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        raise TraceFormatError(f"the trace cannot be read: {type(exc).__name__}: {exc}") from exc


def _session(trace: dict[str, Any], fallback_id: str | None) -> SessionTrace:
    body = trace.get("session_trace") if isinstance(trace.get("session_trace"), dict) else trace
    metadata: dict[str, Any] = {}
    for source in (body.get("session_metadata"), body.get("metadata"), trace.get("metadata")):
        if isinstance(source, dict):
            metadata.update(source)
    sid = _session_id(body, trace, metadata, fallback_id)
    created = _time(body.get("created_at")) or time.time()
    return SessionTrace(
        session_id=sid, created_at=created, timesteps=_steps(body, created, _Ids(sid)),
        metadata=metadata,
        event_rewards=[_build(EventReward, r) for r in _dicts(body.get("event_rewards"))],
        outcome_rewards=[_build(OutcomeReward, r) for r in _dicts(body.get("outcome_rewards"))],
        experiment_id=body.get("experiment_id") if isinstance(body.get("experiment_id"),
                                                              str) else None)


def _session_id(body: dict[str, Any], trace: dict[str, Any], metadata: dict[str, Any],
                fallback_id: str | None) -> str:
    """The first session id given (the body's, the trace's, the metadata's, the fallback);
    `TraceFormatError` when there is none."""
    sid = next((s for s in (body.get("session_id"), trace.get("session_id"),
                            metadata.get("session_id"), fallback_id)
                if isinstance(s, str) and s.strip()), None)
    if sid is None:
        raise TraceFormatError("the trace names no session_id (top level or metadata)",
                               hint="return a v3 trace, or give the rollout's run id")
    return sid


def _steps(body: dict[str, Any], created: float, ids: _Ids) -> list[Timestep]:
    """The session's timesteps (else ones grouped from its histories), each step without
    messages given its LM calls' prompt and reply."""
    steps = [_timestep(raw, i, created, ids) for i, raw in
             enumerate(_dicts(body.get("session_time_steps")))]
    if not steps:
        steps = _steps_from_history(body, created, ids)
    for step in steps:
        if not step.messages:
            step.messages = _messages_of_lm_calls(step.events, ids)
    return steps


class _Ids:
    """Ids for events and messages that came without one: stable per session and position."""

    def __init__(self, session_id: str) -> None:
        self.session_id, self.n = session_id, 0

    def __call__(self, raw: dict[str, Any], kind: str) -> str:
        given = raw.get("id")
        if isinstance(given, str) and given:
            return given
        self.n += 1
        return f"{self.session_id}:{kind}{self.n}"


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _time(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, dict):  # synth-ai's TimeRecord
        return _time(value.get("event_time"))
    return epoch(value) if isinstance(value, str) else None


def _timestep(raw: dict[str, Any], index: int, created: float, ids: _Ids) -> Timestep:
    index = raw.get("step_index") if isinstance(raw.get("step_index"), int) else index
    return Timestep(
        step_id=str(raw.get("step_id") or f"step-{index}"), step_index=index,
        turn_number=raw.get("turn_number") if isinstance(raw.get("turn_number"), int) else None,
        timestamp=_time(raw.get("timestamp")) or created,
        completed_at=_time(raw.get("completed_at")),
        events=[_event(e, created, ids) for e in _dicts(raw.get("events"))],
        messages=[_message(m, created, ids) for m in
                  _dicts(raw.get("markov_blanket_messages") or raw.get("messages"))],
        step_metadata=dict(raw.get("step_metadata") or {}))


def _steps_from_history(body: dict[str, Any], created: float, ids: _Ids) -> list[Timestep]:
    """Timesteps for a trace that has only histories: grouped by ``metadata.step_id``."""
    steps: dict[str, Timestep] = {}

    def step_of(raw: dict[str, Any]) -> Timestep:
        meta = raw.get("metadata") if isinstance(raw.get("metadata"), dict) else {}
        key = str(meta.get("step_id") or "step-0")
        if key not in steps:
            steps[key] = Timestep(step_id=key, step_index=len(steps), timestamp=created)
        return steps[key]

    for raw in _dicts(body.get("event_history")):
        step_of(raw).events.append(_event(raw, created, ids))
    for raw in _dicts(body.get("markov_blanket_message_history")):
        step_of(raw).messages.append(_message(raw, created, ids))
    return list(steps.values())


def _event(raw: dict[str, Any], created: float, ids: _Ids) -> Event:
    kind = _event_kind(raw)
    metadata = dict(raw.get("metadata") or {})
    for extra in ("actions", "correlation_id"):
        if extra in raw:
            metadata.setdefault(extra, raw[extra])
    event = Event(event_type=kind, system_instance_id=str(raw.get("system_instance_id") or
                                                          ("policy" if kind == "cais" else kind)),
                  event_time=_event_time(raw, created), metadata=metadata, id=ids(raw, "e"))
    if kind == "cais":
        _fill_lm_call(event, raw)
    elif kind == "environment":
        _fill_environment_step(event, raw)
    return event


def _event_time(raw: dict[str, Any], created: float) -> float:
    """When the event happened: its event_time, time_record or timestamp, else the
    session's start."""
    return (_time(raw.get("event_time")) or _time(raw.get("time_record"))
            or _time(raw.get("timestamp")) or created)


def _event_kind(raw: dict[str, Any]) -> str:
    """The event's kind as named, else what its fields say it is (an LM call, an
    environment step), else runtime."""
    kind = raw.get("event_type") or raw.get("type")
    if kind in _EVENT_KINDS:
        return kind
    return ("cais" if kind in _LM_CALL_KINDS or any(k in raw for k in _LM_FIELDS) else
            "environment" if any(k in raw for k in _ENV_FIELDS) else "runtime")


def _fill_environment_step(event: Event, raw: dict[str, Any]) -> None:
    """An environment step's reward, end flags and states, where they have the right type."""
    event.reward = _number(raw.get("reward"))
    event.terminated = _flag(raw.get("terminated"))
    event.truncated = _flag(raw.get("truncated"))
    event.system_state_before = _dict_or_none(raw.get("system_state_before"))
    event.system_state_after = _dict_or_none(raw.get("system_state_after"))


def _raw_usage(raw: dict[str, Any], response: dict[str, Any] | None) -> dict[str, Any]:
    """The LM call's usage: its own, else its response's, else none."""
    usage = raw.get("usage") if isinstance(raw.get("usage"), dict) else None
    if usage is None and response is not None and isinstance(response.get("usage"), dict):
        usage = response["usage"]
    return usage or {}


def _fill_lm_call(event: Event, raw: dict[str, Any]) -> None:
    request = raw.get("llm_request") if isinstance(raw.get("llm_request"), dict) else None
    response = raw.get("llm_response") if isinstance(raw.get("llm_response"), dict) else None
    usage = _raw_usage(raw, response)
    event.model_name = raw.get("model_name") or (request or {}).get("model") or None
    event.provider = raw.get("provider")
    event.input_tokens = _int(raw.get("input_tokens"), usage.get("prompt_tokens"),
                              usage.get("input_tokens"))
    event.output_tokens = _int(raw.get("output_tokens"), usage.get("completion_tokens"),
                               usage.get("output_tokens"))
    event.total_tokens = _int(raw.get("total_tokens"), usage.get("total_tokens"))
    event.cost_usd = _number(raw.get("cost_usd"))
    event.latency_ms = _number(raw.get("latency_ms"))
    event.usage = dict(usage) if "prompt_tokens" in usage else usage_from_counts(
        event.input_tokens, event.output_tokens, event.total_tokens)
    event.call_records = _call_records(raw, request, response, event.usage) or None
    try:
        event.tokens = TurnTokens.from_dict(raw.get("tokens"))
    except ValueError as exc:
        raise TraceFormatError(f"event {event.id}: tokens: {exc}") from None


def _call_records(raw: dict[str, Any], request: dict[str, Any] | None,
                  response: dict[str, Any] | None, usage: dict[str, Any] | None
                  ) -> list[dict[str, Any]]:
    """The LM call's records as given, else one made of its request and response."""
    records = _dicts(raw.get("call_records"))
    if not records and (request is not None or response is not None):
        reply = (response or {}).get("message", response)
        records = [{"request": request or {}, "response": reply,
                    **({"usage": usage} if usage else {})}]
    return records


def _message(raw: dict[str, Any], created: float, ids: _Ids) -> Message:
    content = raw.get("content")
    if isinstance(content, dict) and set(content) == {"text", "json_payload"}:
        content = _payload(content)  # synth-ai's SessionMessageContent
    return Message(message_type=str(raw.get("message_type") or raw.get("role") or "user"),
                   content=content,
                   timestamp=_time(raw.get("timestamp")) or _time(raw.get("time_record"))
                   or created,
                   metadata=dict(raw.get("metadata") or {}), id=ids(raw, "m"))


def _payload(content: dict[str, Any]) -> Any:
    if content.get("json_payload") is not None:
        try:
            return json.loads(content["json_payload"])
        except (TypeError, ValueError):
            return content["json_payload"]
    return content.get("text")


def _messages_of_lm_calls(events: list[Event], ids: _Ids) -> list[Message]:
    """The prompt and reply of the step's LM calls, for a trace that recorded no messages
    (what `traces export` turns into SFT examples)."""
    messages: list[Message] = []
    for event in events:
        for record in event.call_records or ():
            request = record.get("request") if isinstance(record.get("request"), dict) else {}
            reply = record.get("response") if isinstance(record.get("response"), dict) else {}
            for m in _dicts(request.get("messages")):
                messages.append(_chat_message(m, event.event_time, ids))
            if reply.get("role") == "assistant" or "content" in reply:
                messages.append(_chat_message({"role": "assistant", **reply}, event.event_time,
                                              ids))
    return messages


def _chat_message(m: dict[str, Any], at: float, ids: _Ids) -> Message:
    role = str(m.get("role") or "user")
    metadata = {"tool_calls": m["tool_calls"]} if m.get("tool_calls") else {}
    return Message(message_type="tool_result" if role == "tool" else role,
                   content=m.get("content"), timestamp=at, metadata=metadata, id=ids({}, "m"))


def _build(kind: type, raw: dict[str, Any]) -> Any:
    names = {f.name for f in fields(kind)}
    values = {k: v for k, v in raw.items() if k in names}
    if "created_at" in values:
        values["created_at"] = _time(values["created_at"]) or 0.0
    return kind(**values)


def _int(*values: Any) -> int | None:
    for value in values:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return token_count(value)
    return None


def _number(value: Any) -> float | None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        return float(value)
    except OverflowError:  # an integer past a double: no number we can keep
        return None


def _flag(value: Any) -> bool | None:
    return None if value is None else bool(value)


def _dict_or_none(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


__all__ = ["session_from_trace"]
