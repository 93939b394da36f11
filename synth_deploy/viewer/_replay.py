"""One stored session → the replay the page draws, turn by turn.

Each turn holds the messages the policy saw that no earlier turn showed (text and images: a
policy call records the whole conversation, `tracing.replay` keeps what is new), its replies
and tool calls, its LM calls (model, tokens, latency), the environment's events with their
rewards and achievements, and the turn's timing (an LM call that captured token data shows
its ids and logprobs, and where continuity broke); its two rewards are kept apart (the
environment's, the event rewards recorded), and achievements are shown only for an app that
records them. Images are passed on only as ``data:``
URLs of raster types: the page never loads anything from outside (it works offline, and a
trace cannot make the browser call a remote address).
"""

from __future__ import annotations

import re
from typing import Any

from synth_deploy.tracing import (
    ContinuityBreak,
    Event,
    EventReward,
    Message,
    ReplayStep,
    SessionTrace,
    replay,
    summarize,
    utc_text,
)

SHOWN_IDS = 2000  # per LM call: the page draws ids, not a whole long prompt

_IMAGE_DATA_URL = re.compile(r"data:image/(?:png|jpeg|gif|webp);base64,[A-Za-z0-9+/=\s]+")
_ACHIEVEMENT_KEYS = ("achievements", "unlocked_achievements", "new_achievements")


def session_replay(session: SessionTrace) -> dict[str, Any]:
    """The JSON the replay page shows for ``session`` (see the module docstring)."""
    by_event, by_turn = _rewards_by_place(session)
    tokens, breaks = _token_capture(session)
    turns = [_turn(step, by_event, by_turn, breaks) for step in replay(session)]
    return {
        **_header(session),
        "outcome_rewards": [{"total_reward": o.total_reward,
                             "achievements_count": o.achievements_count,
                             "total_steps": o.total_steps,
                             "reward_metadata": o.reward_metadata,
                             "annotation": o.annotation} for o in session.outcome_rewards],
        "totals": _totals(session, turns),
        "turns": turns,
        "token_summary": tokens.to_dict() if tokens else None,
        # Whether the app records achievements at all: an outcome's count defaults to 0.
        "has_achievements": any(o.achievements_count for o in session.outcome_rewards)
        or any(e["achievements"] is not None for t in turns for e in t["env_events"]),
    }


def _header(session: SessionTrace) -> dict[str, Any]:
    """Which rollout the session recorded, and how it ended (from its metadata)."""
    meta = session.metadata
    request = meta.get("request") if isinstance(meta.get("request"), dict) else {}
    env_config = ((request.get("env") or {}).get("config") or {}) if request else {}
    error = meta.get("error") if isinstance(meta.get("error"), dict) else None
    return {
        "session_id": session.session_id,
        "created_at": _iso(session.created_at),
        "app_id": meta.get("app_id") or meta.get("env_name"),
        "app_version": meta.get("app_version"),  # which code of the app made it
        "app_digest": meta.get("app_digest"),
        "run_id": meta.get("run_id"),
        "model": meta.get("model"),
        "seed": meta.get("seed"),
        "mode": meta.get("mode"),
        "split": env_config.get("split"),
        "status": meta.get("status") or "ok",
        "duration_s": meta.get("duration_s"),
        "error": _error_text(error),
        "metrics": meta.get("metrics") if isinstance(meta.get("metrics"), dict) else {},
    }


def _error_text(error: dict[str, Any] | None) -> str | None:
    """A failed rollout's message, after who failed (its kind) when the session says."""
    if not error:
        return None
    kind = error.get("kind")
    return f"[{kind}] {error.get('message')}" if kind else error.get("message")


def _rewards_by_place(session: SessionTrace
                      ) -> tuple[dict[str, list[EventReward]], dict[int | None, list[EventReward]]]:
    """Event rewards by the event they score, and (those tied to no event) by turn."""
    by_event: dict[str, list[EventReward]] = {}
    by_turn: dict[int | None, list[EventReward]] = {}
    for reward in session.event_rewards:
        if reward.event_id:
            by_event.setdefault(reward.event_id, []).append(reward)
        else:
            by_turn.setdefault(reward.turn_number, []).append(reward)
    return by_event, by_turn


def _token_capture(session: SessionTrace) -> tuple[Any, dict[str, ContinuityBreak]]:
    """The session's token summary (None: nothing captured) and each continuity break by
    the id of the LM call where it happened."""
    captured = [e for e in session.events if e.tokens is not None]
    if not captured:
        return None, {}
    tokens = summarize([e.tokens for e in captured])
    observed = [e for e in captured if e.tokens.observed]
    return tokens, {observed[b.turn - 1].id: b for b in tokens.breaks}


def _totals(session: SessionTrace, turns: list[dict[str, Any]]) -> dict[str, Any]:
    lm_calls = [c for t in turns for c in t["lm_calls"]]
    return {
        "turns": len(turns),
        "lm_calls": len(lm_calls),
        "input_tokens": _sum_of(lm_calls, "input_tokens", 0),
        "output_tokens": _sum_of(lm_calls, "output_tokens", 0),
        "latency_ms": _sum_of(lm_calls, "latency_ms", 0.0),
        "event_reward": sum(r.reward_value for r in session.event_rewards),
        "event_rewards": len(session.event_rewards),
        "images": _images(turns),
    }


def _sum_of(rows: list[dict[str, Any]], key: str, none: float) -> float:
    """The sum of ``key`` over ``rows``, a missing value counted as ``none``."""
    return sum(row[key] or none for row in rows)


def _images(turns: list[dict[str, Any]]) -> int:
    """How many images the turns' messages show."""
    return sum(1 for t in turns for m in t["messages"] for p in m["parts"]
               if p["type"] == "image")


def _turn(replayed: ReplayStep, by_event: dict[str, list[EventReward]],
          by_turn: dict[int | None, list[EventReward]],
          breaks: dict[str, ContinuityBreak]) -> dict[str, Any]:
    step = replayed.step
    env_events = [_env_event(e, by_event.get(e.id, [])) for e in step.events
                  if e.event_type != "cais"]
    loose = by_turn.pop(step.turn_number, []) if step.turn_number is not None else []
    return {
        "step_id": step.step_id,
        "index": step.step_index,
        "turn": step.turn_number,
        "started_at": _iso(step.timestamp),
        "duration_ms": _duration_ms(step),
        # Each policy call records the whole conversation: a turn shows what it added.
        "messages": [_message(m) for m in replayed.messages],
        "repeated_messages": replayed.repeated,
        "lm_calls": [_lm_call(e, breaks.get(e.id)) for e in step.events
                     if e.event_type == "cais"],
        "env_events": env_events,
        "rewards": [_reward(r) for r in loose],
        **_turn_rewards(env_events, loose),
    }


def _turn_rewards(env_events: list[dict[str, Any]], loose: list[EventReward]
                  ) -> dict[str, Any]:
    """Two different numbers: the rewards the environment's events carry, and the event
    rewards (rubric scores) recorded for the turn (on its events, or loose); and how many
    of those there are."""
    return {
        "env_reward": _env_reward(env_events),
        "reward": sum(r["value"] for ev in env_events for r in ev["rewards"])
        + sum(r.reward_value for r in loose),
        "event_rewards": sum(len(ev["rewards"]) for ev in env_events) + len(loose),
    }


def _duration_ms(step: Any) -> float | None:
    """How long the step took, where both its ends were recorded."""
    if step.completed_at is None or not step.timestamp:
        return None
    return round((step.completed_at - step.timestamp) * 1000, 3)


def _env_reward(env_events: list[dict[str, Any]]) -> float | None:
    """The sum of the rewards the environment's events carry; None when none carries one."""
    rewards = [e["reward"] for e in env_events if e["reward"] is not None]
    return sum(rewards) if rewards else None


def _message(m: Message) -> dict[str, Any]:
    tool_calls = m.metadata.get("tool_calls") if isinstance(m.metadata, dict) else None
    return {"role": m.message_type, "parts": content_parts(m.content), "at": _iso(m.timestamp),
            "tool_calls": [_tool_call(c) for c in tool_calls or [] if isinstance(c, dict)],
            "tool_call_id": m.metadata.get("tool_call_id") if isinstance(m.metadata, dict)
            else None}


def content_parts(content: Any) -> list[dict[str, Any]]:
    """A message's content as parts the page can draw: text, image (a data URL), json."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, dict):
        content = [content]
    if not isinstance(content, list):
        return [{"type": "text", "text": str(content)}]
    return [_part(part) for part in content]


def _part(part: Any) -> dict[str, Any]:
    """One part of a list content: text, an image, or anything else as JSON."""
    if isinstance(part, str):
        return {"type": "text", "text": part}
    if not isinstance(part, dict):
        return {"type": "json", "value": part}
    kind = part.get("type")
    if kind in ("text", "input_text", "output_text") and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    if kind in ("image_url", "input_image", "image"):
        return _image(part)
    return {"type": "json", "value": part}


def _image(part: dict[str, Any]) -> dict[str, Any]:
    ref = part.get("image_url", part.get("url"))
    url = ref.get("url") if isinstance(ref, dict) else ref
    if isinstance(url, str) and _IMAGE_DATA_URL.fullmatch(url):
        return {"type": "image", "src": url}
    # Remote or unusual images are named, never fetched.
    shown = url if isinstance(url, str) and not url.startswith("data:") else "(inline data)"
    return {"type": "image_ref", "url": str(shown)[:300]}


def _tool_call(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function") if isinstance(call.get("function"), dict) else call
    return {"id": call.get("id"), "name": function.get("name"),
            "arguments": function.get("arguments", function.get("input"))}


def _lm_call(e: Event, broke: ContinuityBreak | None) -> dict[str, Any]:
    tool_calls: list[dict[str, Any]] = []
    for record in e.call_records or []:
        response = record.get("response") if isinstance(record, dict) else None
        if isinstance(response, dict):
            tool_calls += [_tool_call(c) for c in response.get("tool_calls") or []
                           if isinstance(c, dict)]
    return {"model": e.model_name, "provider": e.provider, "input_tokens": e.input_tokens,
            "output_tokens": e.output_tokens, "total_tokens": e.total_tokens,
            "latency_ms": e.latency_ms, "cost_usd": e.cost_usd, "tool_calls": tool_calls,
            "at": _iso(e.event_time), "tokens": _tokens(e, broke)}


def _tokens(e: Event, broke: ContinuityBreak | None) -> dict[str, Any] | None:
    t = e.tokens
    if t is None:
        return None
    return {"observed": t.observed, "absent_reason": t.absent_reason, "model": t.model,
            "revision": t.revision, "prompt_count": len(t.prompt_ids),
            "completion_count": len(t.completion_ids),
            "completion_ids": t.completion_ids[:SHOWN_IDS],
            "completion_logprobs": t.completion_logprobs[:SHOWN_IDS],
            "break": broke.__dict__ if broke else None,
            # The prompt's ids from where it left the previous turn's (a few before it).
            "prompt_from": max(0, broke.position - 8) if broke else None,
            "prompt_ids": t.prompt_ids[max(0, broke.position - 8):][:SHOWN_IDS] if broke
            else []}


def _env_event(e: Event, rewards: list[EventReward]) -> dict[str, Any]:
    return {"kind": e.event_type, "system": e.system_instance_id, "reward": e.reward,
            "terminated": e.terminated, "truncated": e.truncated,
            "achievements": _achievements(e.system_state_after),
            "state_after": e.system_state_after, "metadata": e.metadata or {},
            "rewards": [_reward(r) for r in rewards], "at": _iso(e.event_time),
            "latency_ms": e.latency_ms, "sandbox": _sandbox(e)}


def _sandbox(e: Event) -> dict[str, Any] | None:
    """A sandbox's command as its event recorded it (None for any other event)."""
    record = (e.metadata or {}).get("sandbox") if e.system_instance_id == "sandbox" else None
    return record if isinstance(record, dict) and "command" in record else None


def _achievements(state: Any) -> list[str] | None:
    """The achievements the state names (None: it names none, the app has no such thing)."""
    if not isinstance(state, dict):
        return None
    for key in _ACHIEVEMENT_KEYS:
        value = state.get(key)
        if isinstance(value, dict):  # {"collect_wood": 1, "place_table": 0}
            return [str(k) for k, v in value.items() if v]
        if isinstance(value, list):
            return [str(v) for v in value]
    return None


def _reward(r: EventReward) -> dict[str, Any]:
    return {"value": r.reward_value, "type": r.reward_type, "source": r.source,
            "key": r.key, "turn": r.turn_number, "annotation": r.annotation}


def _iso(ts: float | None) -> str | None:
    return utc_text(ts) if ts else None  # the one form a time is given in


__all__ = ["content_parts", "session_replay"]
