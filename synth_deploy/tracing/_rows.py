"""Sessions ⇄ rows of the v3 tables.

Writes are multi-row INSERTs that look ids up by natural keys (``(session_id, step_id)``,
``event_uid``, ``message_uid``) instead of reading autoincrement ids back: a batch of
sessions is then a fixed list of statements, which a remote libSQL server runs in a handful
of round trips, and two writers never need to agree on ids.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from synth_deploy.tracing._session import (
    Event,
    EventReward,
    Message,
    OutcomeReward,
    SessionTrace,
    Timestep,
)

Statement = tuple[str, tuple[Any, ...]]
_ROWS_PER_INSERT = 200
_JSON_CONTENT = "_content_json"

_STEP_ID = "(SELECT id FROM session_timesteps WHERE session_id = ? AND step_id = ?)"
_EVENT_ID = "(SELECT id FROM events WHERE event_uid = ?)"
_MESSAGE_ID = "(SELECT id FROM messages WHERE message_uid = ?)"

_SESSION_COLS = ("session_id", "created_at", "num_timesteps", "num_events", "num_messages",
                 "metadata", "experiment_id", "app_id", "run_id", "status", "model_name",
                 "seed", "total_reward")
_STEP_COLS = ("session_id", "step_id", "step_index", "turn_number", "started_at",
              "completed_at", "num_events", "num_messages", "step_metadata")
_EVENT_COLS = ("session_id", "timestep_id", "event_uid", "event_type", "system_instance_id",
               "event_time", "message_time", "created_at", "model_name", "provider",
               "input_tokens", "output_tokens", "total_tokens", "cost_usd", "latency_ms",
               "call_records", "reward", "terminated", "truncated", "system_state_before",
               "system_state_after", "metadata", "event_metadata")
_MESSAGE_COLS = ("session_id", "timestep_id", "message_uid", "message_type", "content",
                 "timestamp", "event_time", "message_time", "metadata")
_OUTCOME_COLS = ("session_id", "total_reward", "achievements_count", "total_steps",
                 "created_at", "reward_metadata", "annotation")
_EVENT_REWARD_COLS = ("event_id", "session_id", "message_id", "turn_number", "reward_value",
                      "reward_type", '"key"', "annotation", "source", "created_at")


def iso(ts: float | None) -> str | None:
    """Epoch seconds → the sortable UTC text SQLAlchemy's DATETIME used in synth-ai."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def epoch(text: Any) -> float | None:
    if text is None:
        return None
    if isinstance(text, int | float):
        return float(text)
    try:
        parsed = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, default=str, separators=(",", ":"))


def _loads(text: Any, default: Any = None) -> Any:
    if text is None or text == "":
        return default
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return default if default is not None else text


def _bool(value: bool | None) -> int | None:
    return None if value is None else int(bool(value))


def session_reward(session: SessionTrace) -> float | None:
    if session.outcome_rewards:
        return session.outcome_rewards[-1].total_reward
    metrics = session.metadata.get("metrics") or {}
    value = metrics.get("outcome_reward")
    return float(value) if isinstance(value, int | float) else None


def insert_statements(sessions: list[SessionTrace]) -> list[Statement]:
    """Every row of ``sessions`` as multi-row INSERT statements, parents before children."""
    tables: dict[str, tuple[tuple[str, ...], list[str], list[tuple[Any, ...]]]] = {
        name: (cols, [], []) for name, cols in (
            ("session_traces", _SESSION_COLS), ("session_timesteps", _STEP_COLS),
            ("events", _EVENT_COLS), ("messages", _MESSAGE_COLS),
            ("outcome_rewards", _OUTCOME_COLS), ("event_rewards", _EVENT_REWARD_COLS))}

    def add(table: str, placeholders: str, values: tuple[Any, ...]) -> None:
        tables[table][1].append(placeholders)
        tables[table][2].append(values)

    for s in sessions:
        sid, meta = s.session_id, s.metadata
        events = s.events
        seed = meta.get("seed")
        add("session_traces", _marks(len(_SESSION_COLS)), (
            sid, iso(s.created_at), len(s.timesteps), len(events), len(s.messages),
            _json(meta), s.experiment_id, meta.get("app_id"), meta.get("run_id"),
            meta.get("status"), meta.get("model"), seed if isinstance(seed, int) else None,
            session_reward(s)))
        seen: set[str] = set()
        for step in s.timesteps:
            step_id = step.step_id
            while step_id in seen:  # (session_id, step_id) is unique in the v3 schema
                step_id += "+"
            seen.add(step_id)
            add("session_timesteps", _marks(len(_STEP_COLS)), (
                sid, step_id, step.step_index, step.turn_number, iso(step.timestamp),
                iso(step.completed_at), len(step.events), len(step.messages),
                _json(step.step_metadata)))
            for e in step.events:
                add("events", _marks(1, _STEP_ID, len(_EVENT_COLS) - 2), (
                    sid, sid, step_id, e.id, e.event_type, e.system_instance_id, e.event_time,
                    step.step_index, iso(e.event_time), e.model_name, e.provider,
                    e.input_tokens, e.output_tokens, e.total_tokens, e.cost_usd, e.latency_ms,
                    _json(e.call_records), e.reward, _bool(e.terminated), _bool(e.truncated),
                    _json(e.system_state_before), _json(e.system_state_after),
                    _json(e.metadata), None))
            for m in step.messages:
                content, metadata = m.content, dict(m.metadata)
                if not isinstance(content, str) and content is not None:
                    content, metadata[_JSON_CONTENT] = _json(content), True
                add("messages", _marks(1, _STEP_ID, len(_MESSAGE_COLS) - 2), (
                    sid, sid, step_id, m.id, m.message_type, content, iso(m.timestamp),
                    m.timestamp, step.step_index, _json(metadata)))
        for o in s.outcome_rewards:
            add("outcome_rewards", _marks(len(_OUTCOME_COLS)), (
                sid, o.total_reward, o.achievements_count, o.total_steps, iso(o.created_at),
                _json(o.reward_metadata), _json(o.annotation)))
        for r in s.event_rewards:
            add("event_rewards", f"({_EVENT_ID}, ?, {_MESSAGE_ID}, ?, ?, ?, ?, ?, ?, ?)", (
                r.event_id, sid, r.message_id, r.turn_number, r.reward_value, r.reward_type,
                r.key, _json(r.annotation), r.source, iso(r.created_at)))

    statements: list[Statement] = []
    for table, (cols, marks, rows) in tables.items():
        for start in range(0, len(rows), _ROWS_PER_INSERT):
            chunk = slice(start, start + _ROWS_PER_INSERT)
            sql = (f"INSERT INTO {table} ({', '.join(cols)}) VALUES "
                   + ", ".join(marks[chunk]))
            statements.append((sql, tuple(v for row in rows[chunk] for v in row)))
    return statements


def _marks(n: int, middle: str | None = None, after: int = 0) -> str:
    if middle is None:
        return "(" + ", ".join("?" * n) + ")"
    return "(" + ", ".join(["?"] * n + [middle] + ["?"] * after) + ")"


def build_session(row: dict[str, Any], steps: list[dict[str, Any]],
                  events: list[dict[str, Any]], messages: list[dict[str, Any]],
                  outcomes: list[dict[str, Any]], rewards: list[dict[str, Any]]
                  ) -> SessionTrace:
    """A `SessionTrace` from its rows (dicts keyed by column name)."""
    by_step: dict[Any, Timestep] = {}
    timesteps = []
    for st in sorted(steps, key=lambda r: (r["step_index"], r["id"])):
        step = Timestep(step_id=st["step_id"], step_index=st["step_index"],
                        turn_number=st["turn_number"], timestamp=epoch(st["started_at"]) or 0.0,
                        completed_at=epoch(st["completed_at"]),
                        step_metadata=_loads(st["step_metadata"], {}))
        by_step[st["id"]] = step
        timesteps.append(step)
    orphan = None
    event_uid: dict[Any, str] = {}
    for ev in sorted(events, key=lambda r: r["id"]):
        uid = ev.get("event_uid") or str(ev["id"])
        event_uid[ev["id"]] = uid
        event = Event(
            event_type=ev["event_type"], system_instance_id=ev["system_instance_id"] or "",
            event_time=ev["event_time"] or 0.0, metadata=_loads(ev["metadata"], {}),
            model_name=ev["model_name"], provider=ev["provider"],
            input_tokens=ev["input_tokens"], output_tokens=ev["output_tokens"],
            total_tokens=ev["total_tokens"], cost_usd=ev["cost_usd"],
            latency_ms=ev["latency_ms"], call_records=_loads(ev["call_records"]),
            reward=ev["reward"], terminated=_opt_bool(ev["terminated"]),
            truncated=_opt_bool(ev["truncated"]),
            system_state_before=_loads(ev["system_state_before"]),
            system_state_after=_loads(ev["system_state_after"]), id=uid)
        orphan = _step_for(ev["timestep_id"], by_step, timesteps, orphan)
        (by_step.get(ev["timestep_id"]) or orphan).events.append(event)
    message_uid: dict[Any, str] = {}
    for ms in sorted(messages, key=lambda r: r["id"]):
        uid = ms.get("message_uid") or str(ms["id"])
        message_uid[ms["id"]] = uid
        metadata = _loads(ms["metadata"], {})
        content = ms["content"]
        if metadata.pop(_JSON_CONTENT, False):
            content = _loads(content)
        message = Message(message_type=ms["message_type"], content=content,
                          timestamp=ms["event_time"] or epoch(ms["timestamp"]) or 0.0,
                          metadata=metadata, id=uid)
        orphan = _step_for(ms["timestep_id"], by_step, timesteps, orphan)
        (by_step.get(ms["timestep_id"]) or orphan).messages.append(message)
    return SessionTrace(
        session_id=row["session_id"], created_at=epoch(row["created_at"]) or 0.0,
        timesteps=timesteps, metadata=_loads(row["metadata"], {}),
        experiment_id=row["experiment_id"],
        outcome_rewards=[OutcomeReward(
            total_reward=o["total_reward"], achievements_count=o["achievements_count"],
            total_steps=o["total_steps"], reward_metadata=_loads(o["reward_metadata"], {}),
            annotation=_loads(o.get("annotation")), created_at=epoch(o["created_at"]) or 0.0)
            for o in sorted(outcomes, key=lambda r: r["id"])],
        event_rewards=[EventReward(
            reward_value=r["reward_value"], reward_type=r["reward_type"] or "",
            source=r["source"] or "", turn_number=r["turn_number"],
            event_id=event_uid.get(r["event_id"]), message_id=message_uid.get(r["message_id"]),
            key=r["key"], annotation=_loads(r["annotation"]),
            created_at=epoch(r["created_at"]) or 0.0)
            for r in sorted(rewards, key=lambda r: r["id"])])


def _step_for(timestep_id: Any, by_step: dict[Any, Timestep], timesteps: list[Timestep],
              orphan: Timestep | None) -> Timestep | None:
    # Rows written without a timestep (possible in synth-ai data) get one of their own.
    if timestep_id in by_step or orphan is not None:
        return orphan
    orphan = Timestep(step_id="(no timestep)", step_index=len(timesteps))
    timesteps.append(orphan)
    return orphan


def _opt_bool(value: Any) -> bool | None:
    return None if value is None else bool(value)


__all__ = ["build_session", "epoch", "insert_statements", "iso", "session_reward"]
