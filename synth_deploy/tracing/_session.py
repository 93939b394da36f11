"""`SessionTracer`: what a rollout records, kept in memory until the server commits it.

A rollout never waits on the database while it runs: the tracer only appends to a
`SessionTrace`. The server hands the finished session to the trace store and commits it
before the HTTP response goes out (see `synth_deploy.serving.create_app`).

The shape of `SessionTrace.to_dict()` is the v3 in-memory session trace
(shared/spec/tracing-v3.md), which `/rollout` returns as ``trace`` when asked.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import random
import time
import weakref
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pydantic_core import from_json

from synth_deploy.tracing._tokens import TurnTokens, shared_prefix
from synth_deploy.tracing._trace_context import TRACEPARENT, incoming_trace_parent

MessageType = Literal["user", "assistant", "system", "tool_use", "tool_result"]


def finite_reward(value: Any, what: str) -> float:
    """``value`` as a float, or a ValueError saying that ``what`` (a reward) is NaN or
    infinite: JSON carries no such number (a trainer reads null, or 0), and the store has
    no place for one."""
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{what} must be a finite number, got {number!r}: a trainer "
                         "cannot learn from it (a division by zero in the reward?)")
    return number


_MILLIS_MASK = (1 << 44) - 1  # 44 bits of milliseconds: the year 2527


def _new_id() -> str:
    # 32 hex digits: the millisecond it was made (11), then 84 random bits (21). Ids made
    # close in time sort close, so a store's id indexes (sessions, event and message uids)
    # grow at their right edge, where a coarser time in front spreads each second's inserts
    # over that second's part of every index. The 16 digits `traces ls` prints keep 20
    # random bits past the millisecond, enough for a busy millisecond's sessions.
    millis = time.time_ns() // 1_000_000 & _MILLIS_MASK
    return (millis << 84 | _ids.getrandbits(84)).to_bytes(16, "big").hex()


# Ids need to be unique, not secret: a generator of our own instead of os.urandom, whose
# syscall per rollout showed in the server's profile. Not the shared `random`, which a
# rollout may seed for its environment (every session would get the same id), and seeded
# again from the OS in a forked child.
_ids = random.Random()
os.register_at_fork(after_in_child=_ids.seed)


@dataclass
class Message:
    message_type: str
    content: Any
    timestamp: float = field(default_factory=time.time)
    metadata: dict[str, Any] = field(default_factory=dict)
    id: str = field(default_factory=_new_id)


@dataclass
class Event:
    """One event: an LM call (``event_type="cais"``), an environment step, or runtime."""

    event_type: Literal["cais", "environment", "runtime"]
    system_instance_id: str
    event_time: float = field(default_factory=time.time)
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
    # OpenAI-style ``usage`` as the policy answered it (synth-ai's eval runner reads it)
    usage: dict[str, Any] | None = None
    # environment
    reward: float | None = None
    terminated: bool | None = None
    truncated: bool | None = None
    system_state_before: dict[str, Any] | None = None
    system_state_after: dict[str, Any] | None = None
    id: str = field(default_factory=_new_id)
    # The ids and log-probabilities of an LM call, when the policy server returned them
    tokens: TurnTokens | None = None


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
    created_at: float = field(default_factory=time.time)


@dataclass
class OutcomeReward:
    total_reward: float
    achievements_count: int = 0
    total_steps: int = 0
    reward_metadata: dict[str, Any] = field(default_factory=dict)
    annotation: dict[str, Any] | None = None
    created_at: float = field(default_factory=time.time)


@dataclass
class Timestep:
    step_id: str
    step_index: int
    turn_number: int | None = None
    timestamp: float = field(default_factory=time.time)
    completed_at: float | None = None
    events: list[Event] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    step_metadata: dict[str, Any] = field(default_factory=dict)
    # Policy calls recorded as they crossed the wire, not yet turned into messages and call
    # records: (index of the call's event, request JSON, answer JSON) each. See
    # `SessionTracer.record_exchange`; `SessionTrace.expand_exchanges` empties it.
    exchanges: list[tuple[int, bytes, bytes]] = field(default_factory=list)
    # The conversation its expanded policy calls hold, as chat messages, one a `Message` of
    # ``messages`` (what the next timestep's conversation continues).
    chat: list[Any] = field(default_factory=list, repr=False, compare=False)


@dataclass
class SessionTrace:
    session_id: str
    created_at: float = field(default_factory=time.time)
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
        self.expand_exchanges()
        return [m for step in self.timesteps for m in step.messages]

    @property
    def turn_tokens(self) -> list[TurnTokens]:
        """The token data of the LM calls that asked for it, in order."""
        return [e.tokens for step in self.timesteps for e in step.events
                if e.tokens is not None]

    def expand_exchanges(self) -> None:
        """Turn the policy calls recorded as wire bytes (`SessionTracer.record_exchange`)
        into their timesteps' messages and their events' call records. Every reader of a
        finished session's conversation calls this first: the stores (as they build rows),
        `to_dict`, `messages` and `SessionTracer.session`.

        A timestep's conversation that begins with the previous one's begins with the same
        `Message`s (its ids and times): each message is one message of the session, which a
        store keeps once (`synth_deploy.tracing._db._once`)."""
        previous: Timestep | None = None
        for step in self.timesteps:
            if step.exchanges:
                _expand(step, [], previous)
            if step.messages:
                if previous is not None:
                    _share(previous.messages, step.messages)
                previous = step

    def to_dict(self) -> dict[str, Any]:
        """The v3 in-memory trace shape (what `/rollout` returns as ``trace``)."""
        self.expand_exchanges()
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


def session_reward(session: SessionTrace) -> float | None:
    """The session's reward: its last outcome reward, else the one its metrics reported."""
    if session.outcome_rewards:
        return session.outcome_rewards[-1].total_reward
    metrics = session.metadata.get("metrics")
    value = metrics.get("outcome_reward") if isinstance(metrics, dict) else None
    return float(value) if isinstance(value, int | float) else None


def usage_from_counts(input_tokens: int | None, output_tokens: int | None,
                      total_tokens: int | None) -> dict[str, Any] | None:
    """An OpenAI-style ``usage`` from token counts (None when there are none)."""
    if input_tokens is None and output_tokens is None and total_tokens is None:
        return None
    if total_tokens is None:
        total_tokens = (input_tokens or 0) + (output_tokens or 0)
    return {"prompt_tokens": input_tokens, "completion_tokens": output_tokens,
            "total_tokens": total_tokens}


_COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens")


def token_count(value: Any) -> int | None:
    """``value`` as a token count: None unless a number from 0 to what SQLite's INTEGER
    holds (a policy server may answer NaN, ``1e400`` or a 400-digit integer)."""
    if type(value) not in (int, float) or not 0 <= value < 2**63:  # NaN fails too
        return None
    return int(value)


def _count(usage: dict[str, Any], name: str) -> int | None:
    return token_count(usage.get(name))


_MESSAGE_TYPES = {"tool": "tool_result", "function": "tool_result"}
_CHAT_FIELDS = ("tool_calls", "tool_call_id", "name")


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

    def __init__(self, session_id: str | None = None, *, metadata: dict[str, Any] | None = None,
                 kept: bool = True):
        """``kept=False``: nobody reads the session past the rollout's own answer (a server
        that neither stores, returns nor exports it), so the conversation is not recorded:
        `record_chat` and `record_exchange` record nothing. What the answer's metrics come
        from (timesteps, rewards, LM calls' tokens and times) is recorded as ever."""
        self._session = SessionTrace(session_id=session_id or _new_id(),
                                     metadata=dict(metadata or {}))
        # Made for a request that came with W3C trace context: the session is its child
        # (kept in its metadata for the store and the spans; `call_policy` sends it on).
        self.trace_parent = incoming_trace_parent()
        if self.trace_parent is not None:
            self._session.metadata.setdefault(TRACEPARENT, self.trace_parent.header())
        self.kept = kept
        self._current: Timestep | None = None
        # The chat messages the current timestep holds, in order (`record_exchange`'s
        # pending calls aside: none are pending while the app records chat of its own).
        self._chat: list[Any] = []
        _recording.add(self)

    @property
    def session(self) -> SessionTrace:
        """The session so far, its policy calls' conversations included."""
        self._expand_current()
        self._session.expand_exchanges()
        return self._session

    @property
    def session_id(self) -> str:
        return self._session.session_id

    @property
    def current_timestep(self) -> Timestep:
        self._expand_current()
        return self._step()

    def _step(self) -> Timestep:
        if self._current is None:
            return self.start_timestep("step-0")
        return self._current

    def _expand_current(self) -> None:
        """The current timestep's pending policy calls made messages, before anything else
        joins its conversation (which then continues from them)."""
        step = self._current
        if step is not None and step.exchanges:
            self._chat = _expand(step, [])

    def start_timestep(self, step_id: str | None = None, *, turn_number: int | None = None,
                       metadata: dict[str, Any] | None = None) -> Timestep:
        if self._current is not None and self._current.completed_at is None:
            self._current.completed_at = time.time()
        index = len(self._session.timesteps)
        step = Timestep(step_id=step_id or f"step-{index}", step_index=index,
                        turn_number=turn_number, step_metadata=dict(metadata or {}))
        self._session.timesteps.append(step)
        self._current = step
        self._chat = []
        return step

    def end_timestep(self) -> None:
        if self._current is not None and self._current.completed_at is None:
            self._current.completed_at = time.time()

    def record_message(self, message_type: MessageType | str, content: Any,
                       metadata: dict[str, Any] | None = None) -> Message:
        msg = Message(message_type=message_type, content=content, metadata=dict(metadata or {}))
        self.current_timestep.messages.append(msg)
        return msg

    def record_chat(self, messages: list[dict[str, Any]]) -> list[Message]:
        """Record a conversation (OpenAI chat messages) in the current timestep.

        A timestep holds one conversation: when ``messages`` continues the one it holds (a
        second policy call of the same turn, after a corrective message), only the new
        messages are added. Tool calls, tool call ids and names go into each message's
        metadata; content is kept as given (text, or parts with images).
        """
        if not self.kept:
            return []
        step = self.current_timestep  # started before its messages are made
        recorded, self._chat = _continued(self._chat, messages, time.time())
        step.messages += recorded
        return recorded

    def record_exchange(self, event: Event, request: bytes, answer: bytes) -> None:
        """Record the conversation of the policy call ``event`` (of the current timestep) as
        it crossed the wire: the request's JSON and the answer's. Its messages and call
        record are made when the session is read (`SessionTrace.expand_exchanges`), so a
        served app's loop never copies or re-reads a conversation; a store builds them in
        its writer, off the loop. What `record_chat` would record of the request's messages
        and then of the answer, with the call's time."""
        if not self.kept:
            return
        step = self._step()
        events = step.events
        index = len(events) - 1  # call_policy records the call just before its bytes
        if index < 0 or events[index] is not event:
            index = next(i for i in range(len(events) - 1, -1, -1) if events[i] is event)
        if self._chat and not step.exchanges:  # the app's own chat leads this timestep
            self._chat = _expand_one(step, self._chat, index, request, answer)
        else:
            step.exchanges.append((index, request, answer))

    def record_lm_call(self, *, model_name: str | None, provider: str | None = None,
                       input_tokens: int | None = None, output_tokens: int | None = None,
                       latency_ms: float | None = None, cost_usd: float | None = None,
                       call_records: list[dict[str, Any]] | None = None,
                       usage: dict[str, Any] | None = None,
                       system_instance_id: str = "policy",
                       metadata: dict[str, Any] | None = None,
                       tokens: TurnTokens | None = None) -> Event:
        """Record one LM call. ``usage`` is the OpenAI-style object the model answered
        (``prompt_tokens``/``completion_tokens``/``total_tokens``); the token counts default
        to it, and without it a ``usage`` is built from the counts. ``tokens``: the ids and
        log-probabilities the policy server returned (see `synth_deploy.tracing.TurnTokens`)."""
        usage = dict(usage) if isinstance(usage, dict) else None
        if usage is not None:  # its counts as they are read, stored and given back
            usage.update((name, _count(usage, name)) for name in _COUNTS if name in usage)
            input_tokens = _count(usage, "prompt_tokens") if input_tokens is None else input_tokens
            output_tokens = (_count(usage, "completion_tokens") if output_tokens is None
                             else output_tokens)
        total = None if input_tokens is None and output_tokens is None else (
            (input_tokens or 0) + (output_tokens or 0))
        if usage is not None:
            total = _count(usage, "total_tokens") if "total_tokens" in usage else total
        elif total is not None:
            usage = usage_from_counts(input_tokens, output_tokens, total)
        event = Event(event_type="cais", system_instance_id=system_instance_id,
                      model_name=model_name, provider=provider, input_tokens=input_tokens,
                      output_tokens=output_tokens, total_tokens=total, latency_ms=latency_ms,
                      cost_usd=cost_usd, call_records=call_records, usage=usage,
                      metadata=dict(metadata or {}), tokens=tokens)
        self._step().events.append(event)
        return event

    def record_environment_event(self, *, reward: float | None = None,
                                 terminated: bool | None = None, truncated: bool | None = None,
                                 state_before: dict[str, Any] | None = None,
                                 state_after: dict[str, Any] | None = None,
                                 system_instance_id: str = "environment",
                                 metadata: dict[str, Any] | None = None) -> Event:
        if reward is not None:
            reward = finite_reward(reward, "the environment event's reward")
        event = Event(event_type="environment", system_instance_id=system_instance_id,
                      reward=reward, terminated=terminated, truncated=truncated,
                      system_state_before=state_before, system_state_after=state_after,
                      metadata=dict(metadata or {}))
        self._step().events.append(event)
        return event

    def record_runtime_event(self, *, system_instance_id: str,
                             latency_ms: float | None = None,
                             metadata: dict[str, Any] | None = None) -> Event:
        """Record work the environment's runtime did (a sandbox's command: its metadata
        says what ran and how it ended, ``latency_ms`` how long it took)."""
        event = Event(event_type="runtime", system_instance_id=system_instance_id,
                      latency_ms=latency_ms, metadata=dict(metadata or {}))
        self._step().events.append(event)
        return event

    def record_event_reward(self, reward_value: float, *, reward_type: str,
                            source: str = "environment", turn_number: int | None = None,
                            event_id: str | None = None, message_id: str | None = None,
                            key: str | None = None,
                            annotation: dict[str, Any] | None = None) -> EventReward:
        reward = EventReward(reward_value=finite_reward(reward_value,
                                                        f"the {reward_type!r} event reward"),
                             reward_type=reward_type,
                             source=source, turn_number=turn_number, event_id=event_id,
                             message_id=message_id, key=key, annotation=annotation)
        self._session.event_rewards.append(reward)
        return reward

    def record_outcome_reward(self, total_reward: float, *, achievements_count: int = 0,
                              total_steps: int | None = None,
                              metadata: dict[str, Any] | None = None,
                              annotation: dict[str, Any] | None = None) -> OutcomeReward:
        steps = len(self._session.timesteps) if total_steps is None else total_steps
        reward = OutcomeReward(total_reward=finite_reward(total_reward, "the outcome reward"),
                               achievements_count=achievements_count, total_steps=steps,
                               reward_metadata=dict(metadata or {}), annotation=annotation)
        self._session.outcome_rewards.append(reward)
        return reward

    def finish(self, *, expand: bool = True) -> SessionTrace:
        """The finished session. ``expand=False`` leaves its policy calls as the bytes they
        were (`record_exchange`) for its reader to expand: a served app's store does that
        in its writer, off the event loop."""
        self.end_timestep()
        _recording.discard(self)
        if expand:
            self._session.expand_exchanges()
        return self._session


def _continued(held: list[Any], messages: list[dict[str, Any]], at: float,
               ids: Iterator[str] | None = None) -> tuple[list[Message], list[Any]]:
    """The messages recording ``messages`` adds to a timestep holding the conversation
    ``held`` (only the new ones when it continues it), and the conversation it then holds.
    ``ids``: where the new messages' ids come from (fresh ones without it)."""
    known = len(held)
    if messages[:known] != held:
        known = 0  # a different conversation: record it whole
    return [_chat_message(m, at, ids) for m in messages[known:]], list(messages)


def _chat_message(m: dict[str, Any], at: float, ids: Iterator[str] | None) -> Message:
    role = m.get("role", "user")
    return Message(_MESSAGE_TYPES.get(role, role), m.get("content"), at,
                   {k: m[k] for k in _CHAT_FIELDS if m.get(k)},
                   _new_id() if ids is None else next(ids))


def chat_reply(message: dict[str, Any]) -> dict[str, Any]:
    """What the app puts back into the conversation for a completion's ``message``: its
    content and tool calls only (`synth_deploy.taskapp.tools.assistant_message`)."""
    reply: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        reply["tool_calls"] = list(message["tool_calls"])
    return reply


def _share(previous: list[Message], messages: list[Message]) -> None:
    """The leading messages of ``messages`` equal to ``previous``'s made those same objects;
    a conversation that is wholly its predecessor's keeps its last message its own (the one
    a store keeps for it)."""
    limit = min(len(previous), len(messages))
    if len(messages) <= len(previous):
        limit -= 1
    if previous[:limit] == messages[:limit]:  # shared already (or equal in every field)
        return
    for i in range(limit):
        a, b = previous[i], messages[i]
        if a is b:
            continue
        if (a.message_type, a.content, a.metadata) != (b.message_type, b.content, b.metadata):
            return
        messages[i] = a


def _expand(step: Timestep, held: list[Any], previous: Timestep | None = None) -> list[Any]:
    """``step``'s pending policy calls made messages and call records, in order; the
    conversation the step then holds. ``previous``: the timestep before it with a
    conversation, whose messages its first call's conversation may begin with."""
    pending, step.exchanges = step.exchanges, []  # taken first: a second reader finds none
    base = previous if previous is not None and not held and not step.messages else None
    for index, request, answer in pending:
        held = _expand_one(step, held, index, request, answer, base)
        base = None
    step.chat = held
    return held


def _expand_one(step: Timestep, held: list[Any], index: int, request: bytes, answer: bytes,
                base: Timestep | None = None) -> list[Any]:
    event = step.events[index]
    try:
        body, data = _json(request), _json(answer)
        message, sent_messages = data["choices"][0]["message"], body["messages"]
        if not (isinstance(message, dict) and isinstance(sent_messages, list)
                and all(isinstance(m, dict) for m in sent_messages)):
            raise TypeError("not a chat request and its completion")
    except (ValueError, LookupError, TypeError) as exc:
        # Never from `call_policy`, which checks the answer before it records it: bytes an
        # app passed itself are kept as text, and the session is stored all the same.
        event.call_records = [{"request_text": request.decode("utf-8", "replace"),
                               "response_text": answer.decode("utf-8", "replace"),
                               "error": f"not read as a chat call: {type(exc).__name__}"}]
        return held
    record: dict[str, Any] = {"request": body, "response": message}
    if isinstance(data.get("usage"), dict):
        record["usage"] = data["usage"]
    event.call_records = [record]
    reply = chat_reply(message)
    # Ids from the call's own: a session built twice from the same bytes (a journal row
    # two stores built at once) is the same session, which the second stores as done.
    ids = (_derived_id(event.id, n) for n in itertools.count())
    if base is not None and len(base.chat) == len(base.messages):
        # The same messages as the timestep before, as far as they agree: made once.
        shared = shared_prefix(base.chat, sent_messages)
        fresh, _ = _continued([], sent_messages[shared:], event.event_time, ids)
        sent = base.messages[:shared] + fresh
    else:
        sent, _ = _continued(held, sent_messages, event.event_time, ids)
    step.messages += sent
    step.messages.append(_chat_message(reply, event.event_time, ids))
    return [*sent_messages, reply]


def _json(text: bytes | str) -> Any:
    # pydantic-core's parser, a few times faster than json's; json's for what it refuses
    # and json reads (a lone surrogate's escape).
    try:
        return from_json(text)
    except ValueError:
        return json.loads(text)


def _derived_id(parent: str, n: int) -> str:
    """The ``n``-th id made from ``parent``'s: its millisecond, then 84 bits of a hash."""
    digest = hashlib.blake2b(f"{parent}/{n}".encode(), digest_size=11).hexdigest()
    return parent[:11] + digest[:21]


# Tracers not finished yet: rollouts still running in this process. A tracer dropped
# unfinished leaves the set with its last reference.
_recording: weakref.WeakSet[SessionTracer] = weakref.WeakSet()


def sessions_recording() -> int:
    """How many sessions this process is still recording: the writer's hint that more
    writes will follow soon (the writer child journals them, `synth_deploy.tracing._write`)."""
    return len(_recording)


__all__ = [
    "Event",
    "EventReward",
    "Message",
    "OutcomeReward",
    "SessionTrace",
    "SessionTracer",
    "Timestep",
    "chat_reply",
    "finite_reward",
    "session_reward",
    "sessions_recording",
    "usage_from_counts",
]
