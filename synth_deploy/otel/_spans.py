"""A stored rollout as OpenTelemetry spans, following the GenAI semantic conventions.

    rollout {app}                 root: app, seed, split, mode, model, run id, rewards, scores,
     │                            cost ledger, error (status ERROR)
     ├── {step id}                one per timestep; environment events and event rewards
     │    │                       are span events on it
     │    └── chat {model}        one per LM call: gen_ai.operation.name, gen_ai.request.model,
     │                            gen_ai.usage.input_tokens / output_tokens; the messages
     │                            (gen_ai.input.messages / output.messages) only when asked
     └── …

Every id is derived from the session: the trace id from its session id, each span id from
the session id and what the span stands for. Sending a session twice sends the same spans,
so a receiver that keys spans by id (MLflow, Phoenix, Tempo...) keeps one copy. A rollout
that came with W3C trace context (its request's ``traceparent``, kept in the session's
metadata) is in its caller's trace instead: the trace id is the caller's, and the root span's
parent is the caller's span.
Importing this module imports the OpenTelemetry SDK (the ``otel`` extra).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event as SpanEvent
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from synth_deploy import __version__
from synth_deploy.otel._ids import (
    rollout_span_id,
    session_trace_id,
    session_trace_parent,
    span_id_of,
    trace_id_of,
)
from synth_deploy.tracing import (
    Event,
    EventReward,
    SessionTrace,
    Timestep,
    content_text,
    event_tokens,
    ledger_of,
    session_reward,
)

SCOPE = InstrumentationScope("synth_deploy", __version__)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NS = 1_000_000_000
# gen_ai.provider.name for the hosts whose provider is known; others say only server.address.
_PROVIDERS = {"openai.com": "openai", "groq.com": "groq", "anthropic.com": "anthropic",
              "mistral.ai": "mistral_ai", "deepseek.com": "deepseek", "x.ai": "x_ai",
              "googleapis.com": "gcp.gemini"}
_ROLES = {"tool_result": "tool", "tool_use": "assistant"}


def span_count(session: SessionTrace) -> int:
    """How many spans `session_spans` makes of ``session`` (without making them)."""
    return 1 + len(session.timesteps) + sum(
        e.event_type == "cais" for step in session.timesteps for e in step.events)


class SpanMaker:
    """Turns sessions into spans; one per exporter (it caches the resource per service)."""

    def __init__(self, *, service_name: str | None = None, capture_content: bool = False):
        self.service_name = service_name
        self.capture_content = capture_content
        self._resources: dict[str, Resource] = {}

    def _resource(self, app_id: str | None) -> Resource:
        name = self.service_name or app_id or "synth-deploy"
        if name not in self._resources:
            # Resource(...) rather than Resource.create(): no detectors, no environment read.
            self._resources[name] = Resource({
                "service.name": name, "telemetry.sdk.name": "synth-deploy",
                "telemetry.sdk.language": "python", "telemetry.sdk.version": __version__})
        return self._resources[name]

    def spans(self, session: SessionTrace) -> list[ReadableSpan]:
        """The spans of one session, root first."""
        sid = session.session_id
        meta = session.metadata if isinstance(session.metadata, Mapping) else {}
        trace_id = session_trace_id(sid, meta)
        resource = self._resource(_text(meta.get("app_id") or meta.get("env_name")))
        root_ctx = SpanContext(trace_id, rollout_span_id(sid), False, _SAMPLED)
        ledger = ledger_of(session)
        start = _ns(session.created_at) or _first_time(session)
        end = max(start + int(ledger.wall_s * _NS), _last_time(session, start))

        def span(name: str, ctx: SpanContext, parent: SpanContext | None, begin: int,
                 finish: int, attributes: dict[str, Any], *, kind: SpanKind = SpanKind.INTERNAL,
                 events: Iterable[SpanEvent] = (), status: Status | None = None
                 ) -> ReadableSpan:
            return ReadableSpan(name=name, context=ctx, parent=parent, resource=resource,
                                attributes=_clean(attributes), events=tuple(events),
                                kind=kind, status=status or Status(StatusCode.UNSET),
                                start_time=begin, end_time=max(finish, begin),
                                instrumentation_scope=SCOPE)

        rewards_by_step = _rewards_by_step(session)
        out: list[ReadableSpan] = []
        status, error_attrs = _status(meta)
        out.append(span(f"rollout {_text(meta.get('app_id')) or 'task app'}", root_ctx,
                        _root_parent(meta, trace_id),
                        start, end, {**_rollout_attributes(sid, meta, session), **error_attrs,
                                     **_ledger_attributes(ledger)},
                        events=[_reward_event(r, end) for r in rewards_by_step.get(None, [])],
                        status=status))
        for index, step in enumerate(session.timesteps):
            step_ctx = SpanContext(trace_id, span_id_of(sid, "step", index, step.step_id),
                                   False, _SAMPLED)
            out.append(_step_span(span, step_ctx, root_ctx, index, step, start,
                                  rewards_by_step.get(index, [])))
            out += [self._lm_span(span, sid, trace_id, step_ctx, step, event)
                    for event in step.events if event.event_type == "cais"]
        return out

    def _lm_span(self, span: Any, sid: str, trace_id: int, parent: SpanContext,
                 step: Timestep, event: Event) -> ReadableSpan:
        record = _first_record(event)
        request = record.get("request") if isinstance(record.get("request"), Mapping) else {}
        model = _text(request.get("model")) or event.model_name or "unknown"
        end = _ns(event.event_time) or _ns(step.timestamp)
        latency = event.latency_ms if isinstance(event.latency_ms, int | float) else 0.0
        attributes = _lm_attributes(model, request, event)
        if self.capture_content:
            attributes.update(_content_attributes(record, request, step))
        ctx = SpanContext(trace_id, span_id_of(sid, "lm", event.id), False, _SAMPLED)
        return span(f"chat {model}", ctx, parent, end - int(max(latency, 0.0) * 1_000_000),
                    end, attributes, kind=SpanKind.CLIENT)


def _root_parent(meta: Mapping[str, Any], trace_id: int) -> SpanContext | None:
    """The caller's span the rollout's joins, when the rollout came with trace context."""
    caller = session_trace_parent(meta)
    return None if caller is None else SpanContext(
        trace_id, int(caller.parent_id, 16), True, TraceFlags(int(caller.flags, 16)))


def _rewards_by_step(session: SessionTrace) -> dict[int | None, list[EventReward]]:
    """The session's event rewards by the index of their step (by event, else by turn);
    None: the rollout's own."""
    step_of_event = {e.id: i for i, step in enumerate(session.timesteps) for e in step.events}
    rewards_by_step: dict[int | None, list[EventReward]] = {}
    for reward in session.event_rewards:
        index = step_of_event.get(reward.event_id) if reward.event_id else None
        if index is None and reward.turn_number is not None:
            index = next((i for i, s in enumerate(session.timesteps)
                          if s.turn_number == reward.turn_number), None)
        rewards_by_step.setdefault(index, []).append(reward)
    return rewards_by_step


def _step_span(span: Any, step_ctx: SpanContext, root_ctx: SpanContext, index: int,
               step: Timestep, start: int, rewards: list[EventReward]) -> ReadableSpan:
    """A timestep's span: its environment steps and rewards as span events, in time order."""
    step_start = _ns(step.timestamp) or start
    events = [_environment_event(e, step_start) for e in step.events
              if e.event_type != "cais"]
    events += [_reward_event(r, step_start) for r in rewards]
    return span(step.step_id or f"step {index}", step_ctx, root_ctx, step_start,
                _step_end(step, step_start), {
                    "synth.step.id": step.step_id, "synth.step.index": index,
                    "synth.step.turn": step.turn_number},
                events=sorted(events, key=lambda e: e.timestamp))


def _lm_attributes(model: str, request: Mapping[str, Any], event: Event) -> dict[str, Any]:
    """An LM call's GenAI attributes: models, tokens, provider, sampling settings, cost."""
    tokens_in, tokens_out = event_tokens(event)
    return {
        "gen_ai.operation.name": "chat", "gen_ai.request.model": model,
        "gen_ai.response.model": event.model_name,
        "gen_ai.usage.input_tokens": tokens_in, "gen_ai.usage.output_tokens": tokens_out,
        "gen_ai.provider.name": _provider(event.provider),
        "server.address": event.provider,
        "gen_ai.request.temperature": request.get("temperature"),
        "gen_ai.request.top_p": request.get("top_p"),
        "gen_ai.request.max_tokens": request.get("max_tokens")
        or request.get("max_completion_tokens"),
        "synth.cost_usd": event.cost_usd,
    }


def _content_attributes(record: Mapping[str, Any], request: Mapping[str, Any],
                        step: Timestep) -> dict[str, Any]:
    """The messages an LM call was sent and answered (only with capture_content)."""
    attributes = {}
    inputs, response = request.get("messages"), record.get("response")
    if not isinstance(inputs, list):  # no call record (synth-ai, record_lm_call):
        inputs, response = _step_chat(step)  # the timestep's conversation
    attributes["gen_ai.input.messages"] = _json([_message_parts(m) for m in inputs
                                                 if isinstance(m, Mapping)])
    if isinstance(response, Mapping):
        attributes["gen_ai.output.messages"] = _json([_message_parts(response)])
    return attributes


def _rollout_attributes(sid: str, meta: Mapping[str, Any],
                        session: SessionTrace) -> dict[str, Any]:
    request = meta.get("request") if isinstance(meta.get("request"), Mapping) else {}
    env = request.get("env") if isinstance(request.get("env"), Mapping) else {}
    env_config = env.get("config") if isinstance(env.get("config"), Mapping) else {}
    metrics = meta.get("metrics") if isinstance(meta.get("metrics"), Mapping) else {}
    return {
        "synth.session_id": sid, "synth.app_id": meta.get("app_id") or meta.get("env_name"),
        "synth.run_id": meta.get("run_id"), "synth.seed": meta.get("seed", env.get("seed")),
        "synth.split": env_config.get("split"), "synth.mode": meta.get("mode"),
        "synth.model": meta.get("model"), "synth.status": meta.get("status"),
        "synth.correlation_id": meta.get("trace_correlation_id"),
        "synth.reward": session_reward(session),
        "synth.outcome_score": metrics.get("outcome_score"),
        "synth.events_score": metrics.get("events_score"),
        "synth.event_rewards": [r.reward_value for r in session.event_rewards],
        "synth.num_steps": len(session.timesteps),
    }


def _ledger_attributes(ledger: Any) -> dict[str, Any]:
    return {"synth.lm_calls": ledger.lm_calls, "synth.tokens.input": ledger.input_tokens,
            "synth.tokens.output": ledger.output_tokens, "synth.time.lm_s": ledger.lm_s,
            "synth.time.env_s": ledger.env_s, "synth.time.wall_s": ledger.wall_s,
            "synth.cost_usd": ledger.cost_usd}


def _status(meta: Mapping[str, Any]) -> tuple[Status, dict[str, Any]]:
    if meta.get("status") != "error":
        return Status(StatusCode.OK if meta.get("status") == "ok" else StatusCode.UNSET), {}
    error = meta.get("error") if isinstance(meta.get("error"), Mapping) else {}
    message = _text(error.get("message")) or "rollout failed"
    return Status(StatusCode.ERROR, message), {
        "error.type": _text(error.get("code")) or "rollout_failed",
        "synth.error.message": message}


def _environment_event(event: Event, fallback: int) -> SpanEvent:
    actions = event.metadata.get("actions") if isinstance(event.metadata, Mapping) else None
    return SpanEvent(f"{event.event_type}.step", _clean({
        "synth.reward": event.reward, "synth.terminated": event.terminated,
        "synth.truncated": event.truncated, "synth.system": event.system_instance_id,
        "synth.actions": [str(a) for a in actions] if isinstance(actions, list) else None,
    }), _ns(event.event_time) or fallback)


def _reward_event(reward: EventReward, fallback: int) -> SpanEvent:
    return SpanEvent("reward", _clean({
        "synth.reward.value": reward.reward_value, "synth.reward.type": reward.reward_type,
        "synth.reward.source": reward.source, "synth.reward.key": reward.key,
        "synth.reward.turn": reward.turn_number}), _ns(reward.created_at) or fallback)


def _message_parts(message: Mapping[str, Any]) -> dict[str, Any]:
    """A chat message in the conventions' shape: role, parts (text, tool calls, tool
    responses)."""
    role = _ROLES.get(str(message.get("role")), message.get("role") or "user")
    parts: list[dict[str, Any]] = []
    content = message.get("content")
    if role == "tool":
        parts.append({"type": "tool_call_response", "id": message.get("tool_call_id"),
                      "response": content_text(content)})
    elif content not in (None, "", []):
        parts.append({"type": "text", "content": content_text(content)})
    for call in message.get("tool_calls") or []:
        if isinstance(call, Mapping):
            function = call.get("function") if isinstance(call.get("function"), Mapping) else {}
            parts.append({"type": "tool_call", "id": call.get("id"),
                          "name": function.get("name"), "arguments": function.get("arguments")})
    return {"role": role, "parts": parts}


def _step_chat(step: Timestep) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """A timestep's recorded messages as (the prompt, the last reply) in chat form."""
    chat = [{"role": _ROLES.get(m.message_type, m.message_type), "content": m.content,
             **{k: m.metadata[k] for k in ("tool_calls", "tool_call_id")
                if isinstance(m.metadata, Mapping) and m.metadata.get(k)}}
            for m in step.messages]
    last = max((i for i, m in enumerate(chat) if m["role"] == "assistant"), default=None)
    return (chat, None) if last is None else (chat[:last], chat[last])


def _first_record(event: Event) -> Mapping[str, Any]:
    records = event.call_records if isinstance(event.call_records, list) else []
    first = records[0] if records else None
    return first if isinstance(first, Mapping) else {}


def _provider(host: str | None) -> str | None:
    host = (host or "").lower()
    return next((name for suffix, name in _PROVIDERS.items()
                 if host == suffix or host.endswith("." + suffix)), None)


def _step_end(step: Timestep, start: int) -> int:
    times = [_ns(step.completed_at)] + [_ns(e.event_time) for e in step.events] \
        + [_ns(m.timestamp) for m in step.messages]
    return max([t for t in times if t] + [start])


def _first_time(session: SessionTrace) -> int:
    times = [_ns(s.timestamp) for s in session.timesteps]
    return min([t for t in times if t], default=1)


def _last_time(session: SessionTrace, start: int) -> int:
    return max([_step_end(s, _ns(s.timestamp) or start) for s in session.timesteps] + [start])


def _ns(seconds: Any) -> int:
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
        return 0
    return int(seconds * _NS)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _clean(attributes: dict[str, Any]) -> dict[str, Any]:
    """Attribute values OTLP can carry: scalars and lists of one scalar type; None dropped,
    anything else as JSON text."""
    out: dict[str, Any] = {}
    for key, value in attributes.items():
        kept = _otlp_value(value)
        if kept is not None:
            out[key] = kept
    return out


def _otlp_value(value: Any) -> Any:
    """``value`` as an OTLP attribute holds it; None for one to drop (None, an empty list)."""
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, list | tuple):
        if not value:
            return None
        if len({type(v) for v in value}) == 1 and isinstance(value[0], str | int | float):
            return list(value)
    return _json(value)


__all__ = ["SCOPE", "SpanMaker", "span_count", "span_id_of", "trace_id_of"]
