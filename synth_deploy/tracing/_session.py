"""`SessionTracer`: what a rollout records, kept in memory until the server commits it.

A rollout never waits on the database while it runs: the tracer only appends to a
`SessionTrace`. The server hands the finished session to the trace store and commits it
before the HTTP response goes out (see `synth_deploy.taskapp.create_app`).

The shape of `SessionTrace.to_dict()` is the v3 in-memory session trace
(shared/spec/tracing-v3.md), which `/rollout` returns as ``trace`` when asked.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

MessageType = Literal["user", "assistant", "system", "tool_use", "tool_result"]


def _now() -> float:
    return time.time()


def _new_id() -> str:
    # 128 random bits as hex, like uuid4().hex but several times cheaper per rollout.
    return os.urandom(16).hex()


@dataclass
class Message:
    message_type: str
    content: Any
    timestamp: float = field(default_factory=_now)
    metadata: dict[str, Any] = field(default_factory=dict)
    id: str = field(default_factory=_new_id)


@dataclass
class Event:
    """One event: an LM call (``event_type="cais"``), an environment step, or runtime."""

    event_type: Literal["cais", "environment", "runtime"]
    system_instance_id: str
    event_time: float = field(default_factory=_now)
    metadata: dict[str, Any] = field(default_factory=dict)
    # LM call ("cais")
    model_name: str | None = None
    provider: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None
    cost_usd: float | None = None
    latency_ms: float | None = None
    call_records: list[dict[str, Any]] | None = None
    # environment
    reward: float | None = None
    terminated: bool | None = None
    truncated: bool | None = None
    system_state_before: dict[str, Any] | None = None
    system_state_after: dict[str, Any] | None = None
    id: str = field(default_factory=_new_id)


@dataclass
class EventReward:
    reward_value: float
    reward_type: str
    source: str = "environment"
    turn_number: int | None = None
    event_id: str | None = None
    message_id: str | None = None
    key: str | None = None
    annotation: dict[str, Any] | None = None
    created_at: float = field(default_factory=_now)


@dataclass
class OutcomeReward:
    total_reward: float
    achievements_count: int = 0
    total_steps: int = 0
    reward_metadata: dict[str, Any] = field(default_factory=dict)
    annotation: dict[str, Any] | None = None
    created_at: float = field(default_factory=_now)


@dataclass
class Timestep:
    step_id: str
    step_index: int
    turn_number: int | None = None
    timestamp: float = field(default_factory=_now)
    completed_at: float | None = None
    events: list[Event] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    step_metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class SessionTrace:
    session_id: str
    created_at: float = field(default_factory=_now)
    timesteps: list[Timestep] = field(default_factory=list)
    event_rewards: list[EventReward] = field(default_factory=list)
    outcome_rewards: list[OutcomeReward] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    experiment_id: str | None = None

    @property
    def events(self) -> list[Event]:
        return [e for step in self.timesteps for e in step.events]

    @property
    def messages(self) -> list[Message]:
        return [m for step in self.timesteps for m in step.messages]

    def to_dict(self) -> dict[str, Any]:
        """The v3 in-memory trace shape (what `/rollout` returns as ``trace``)."""
        steps = []
        for step in self.timesteps:
            steps.append({
                "step_id": step.step_id,
                "step_index": step.step_index,
                "timestamp": step.timestamp,
                "turn_number": step.turn_number,
                "events": [asdict(e) for e in step.events],
                "markov_blanket_messages": [asdict(m) for m in step.messages],
                "step_metadata": step.step_metadata,
                "completed_at": step.completed_at,
            })
        return {
            "session_id": self.session_id,
            "created_at": self.created_at,
            "session_time_steps": steps,
            "event_history": [asdict(e) for e in self.events],
            "markov_blanket_message_history": [asdict(m) for m in self.messages],
            "event_rewards": [asdict(r) for r in self.event_rewards],
            "outcome_rewards": [asdict(r) for r in self.outcome_rewards],
            "metadata": self.metadata,
            "session_metadata": self.metadata,
            "experiment_id": self.experiment_id,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SessionTrace:
        """Invert `to_dict` (also reads traces a `/rollout` returned as ``trace``)."""
        steps = []
        for raw in data.get("session_time_steps") or []:
            steps.append(Timestep(
                step_id=raw["step_id"], step_index=raw.get("step_index", len(steps)),
                turn_number=raw.get("turn_number"), timestamp=raw.get("timestamp") or 0.0,
                completed_at=raw.get("completed_at"),
                events=[_build(Event, e) for e in raw.get("events") or []],
                messages=[_build(Message, m) for m in raw.get("markov_blanket_messages") or []],
                step_metadata=dict(raw.get("step_metadata") or {})))
        return cls(
            session_id=data["session_id"], created_at=data.get("created_at") or 0.0,
            timesteps=steps,
            event_rewards=[_build(EventReward, r) for r in data.get("event_rewards") or []],
            outcome_rewards=[_build(OutcomeReward, r) for r in data.get("outcome_rewards") or []],
            metadata=dict(data.get("metadata") or data.get("session_metadata") or {}),
            experiment_id=data.get("experiment_id"))


def _build(kind: type, raw: dict[str, Any]) -> Any:
    # Unknown keys are ignored so traces from newer writers still load.
    names = {f.name for f in fields(kind)}
    return kind(**{k: v for k, v in raw.items() if k in names})


class SessionTracer:
    """Records one rollout's timesteps, events, messages and rewards.

    Task app authors call it from inside a rollout (``ctx.tracer``)::

        step = tracer.start_timestep("turn-1", turn_number=1)
        tracer.record_message("user", prompt)
        tracer.record_lm_call(model_name=model, input_tokens=12, output_tokens=30, latency_ms=420)
        event = tracer.record_environment_event(reward=1.0, terminated=True)
        tracer.record_event_reward(1.0, reward_type="answer_correct", event_id=event.id)
        tracer.record_outcome_reward(1.0, total_steps=1)
    """

    def __init__(self, session_id: str | None = None, *, metadata: dict[str, Any] | None = None):
        self.session = SessionTrace(session_id=session_id or _new_id(),
                                    metadata=dict(metadata or {}))
        self._current: Timestep | None = None

    @property
    def session_id(self) -> str:
        return self.session.session_id

    @property
    def current_timestep(self) -> Timestep:
        if self._current is None:
            return self.start_timestep("step-0")
        return self._current

    def start_timestep(self, step_id: str | None = None, *, turn_number: int | None = None,
                       metadata: dict[str, Any] | None = None) -> Timestep:
        if self._current is not None and self._current.completed_at is None:
            self._current.completed_at = _now()
        index = len(self.session.timesteps)
        step = Timestep(step_id=step_id or f"step-{index}", step_index=index,
                        turn_number=turn_number, step_metadata=dict(metadata or {}))
        self.session.timesteps.append(step)
        self._current = step
        return step

    def end_timestep(self) -> None:
        if self._current is not None and self._current.completed_at is None:
            self._current.completed_at = _now()

    def record_message(self, message_type: MessageType | str, content: Any,
                       metadata: dict[str, Any] | None = None) -> Message:
        msg = Message(message_type=message_type, content=content, metadata=dict(metadata or {}))
        self.current_timestep.messages.append(msg)
        return msg

    def record_lm_call(self, *, model_name: str | None, provider: str | None = None,
                       input_tokens: int | None = None, output_tokens: int | None = None,
                       latency_ms: float | None = None, cost_usd: float | None = None,
                       call_records: list[dict[str, Any]] | None = None,
                       system_instance_id: str = "policy",
                       metadata: dict[str, Any] | None = None) -> Event:
        total = None if input_tokens is None and output_tokens is None else (
            (input_tokens or 0) + (output_tokens or 0))
        event = Event(event_type="cais", system_instance_id=system_instance_id,
                      model_name=model_name, provider=provider, input_tokens=input_tokens,
                      output_tokens=output_tokens, total_tokens=total, latency_ms=latency_ms,
                      cost_usd=cost_usd, call_records=call_records, metadata=dict(metadata or {}))
        self.current_timestep.events.append(event)
        return event

    def record_environment_event(self, *, reward: float | None = None,
                                 terminated: bool | None = None, truncated: bool | None = None,
                                 state_before: dict[str, Any] | None = None,
                                 state_after: dict[str, Any] | None = None,
                                 system_instance_id: str = "environment",
                                 metadata: dict[str, Any] | None = None) -> Event:
        event = Event(event_type="environment", system_instance_id=system_instance_id,
                      reward=reward, terminated=terminated, truncated=truncated,
                      system_state_before=state_before, system_state_after=state_after,
                      metadata=dict(metadata or {}))
        self.current_timestep.events.append(event)
        return event

    def record_event_reward(self, reward_value: float, *, reward_type: str,
                            source: str = "environment", turn_number: int | None = None,
                            event_id: str | None = None, message_id: str | None = None,
                            key: str | None = None,
                            annotation: dict[str, Any] | None = None) -> EventReward:
        reward = EventReward(reward_value=float(reward_value), reward_type=reward_type,
                             source=source, turn_number=turn_number, event_id=event_id,
                             message_id=message_id, key=key, annotation=annotation)
        self.session.event_rewards.append(reward)
        return reward

    def record_outcome_reward(self, total_reward: float, *, achievements_count: int = 0,
                              total_steps: int | None = None,
                              metadata: dict[str, Any] | None = None,
                              annotation: dict[str, Any] | None = None) -> OutcomeReward:
        steps = len(self.session.timesteps) if total_steps is None else total_steps
        reward = OutcomeReward(total_reward=float(total_reward),
                               achievements_count=achievements_count, total_steps=steps,
                               reward_metadata=dict(metadata or {}), annotation=annotation)
        self.session.outcome_rewards.append(reward)
        return reward

    def finish(self) -> SessionTrace:
        self.end_timestep()
        return self.session


__all__ = [
    "Event",
    "EventReward",
    "Message",
    "OutcomeReward",
    "SessionTrace",
    "SessionTracer",
    "Timestep",
]
