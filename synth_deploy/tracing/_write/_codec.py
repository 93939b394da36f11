"""A session as bytes where it leaves a server: msgpack, written and read by msgspec.

The server's own thread makes these bytes, and a saturated server is short of that
thread's CPU, so they are made the cheapest way measured: msgspec writes the session's
dataclasses as msgpack maps in C, under half of what flattening them to tuples and
pickling those cost (infra/tracing.md). They are what the writer child receives and
journals as it came (`_child`, `_journal`) and what a Modal container's session log holds
(`_log`). What is read back is plain data that names no class, so reading a record runs
no code; `decode_session` builds the dataclasses from it by field name.

A session's token data goes packed (`pack_turns`: each prompt as what it adds to the turn
before), or a long episode's prompts would make the bytes grow with the square of its
turns: ``[session, [[event number, packed turn], ...]]``, the events' ``tokens`` left out
of the session. Its policy requests likewise: each call's request JSON repeats the one
before it to the same system (the conversation so far) and adds the last turn, so in a
session past `PACK_REQUESTS_ABOVE` bytes, a request that repeats at least `SHARED_WORTH`
bytes of that one goes as what follows them, and a third item says which:
``[..., [[exchange number, bytes repeated], ...]]`` (exchanges numbered across the
session in order). A session with none packed has no third item, as before, so a kit
of before reads it.

What msgpack has no type for (an object of the app's own class, an integer past 64 bits)
fails the encoding: such a session is stored in rows instead, exactly. msgspec writes a
few types the way the rows' JSON would write them anyway (a tuple or a set as a list, a
Decimal or a UUID as a string, a datetime in ISO format): what a store reads back is the
same.

Journal rows and log records written before this held pickles of the session's flat form
(`_flat`) with builtins only; `decode_session` reads those too, with an unpickler that
looks no class up.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterator
from typing import Any

import msgspec

from synth_deploy.tracing._rollout_facts import with_description
from synth_deploy.tracing._session import SessionTrace, Timestep
from synth_deploy.tracing._tokens import PackedTurn, pack_turns
from synth_deploy.tracing._write._flat import FIELDS, NESTED, restore

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder()
# What msgspec raises for a value msgpack has no type for (or cannot hold: a lone surrogate
# in a string, an integer past 64 bits).
_UNENCODABLE = (TypeError, ValueError, OverflowError)
_PICKLE = b"\x80"  # how a pickle of protocol 2 or later begins; no encoded session does


# A session's requests are packed once its bytes would pass this: below it, what packing
# saves is not worth the search, and a short rollout's record pays nothing for it.
PACK_REQUESTS_ABOVE = 64 << 10
# Below this, a repeated request is sent whole: the search and the note of it cost more
# than they save.
SHARED_WORTH = 512


def encode_session(session: SessionTrace) -> bytes | None:
    """``session`` as the log keeps it; None when it holds what msgpack has no type for."""
    with_tokens = [(n, event) for n, event in enumerate(
        event for step in session.timesteps for event in step.events)
        if event.tokens is not None]
    if not with_tokens:
        return _encoded(session, None)
    turns = [event.tokens for _, event in with_tokens]
    packed = [[n, row] for (n, _), row in zip(with_tokens, pack_turns(turns), strict=True)]
    for _, event in with_tokens:  # sent packed, beside the session: out of it meanwhile
        event.tokens = None
    try:
        return _encoded(session, packed)
    finally:
        for (_, event), tokens in zip(with_tokens, turns, strict=True):
            event.tokens = tokens


def _encoded(session: SessionTrace, packed: list[list[Any]] | None) -> bytes | None:
    body = encode((session, packed))
    if body is not None and len(body) > PACK_REQUESTS_ABOVE:
        body = _with_packed_requests(session, packed) or body
    return body


def _with_packed_requests(session: SessionTrace, packed: list[list[Any]] | None
                          ) -> bytes | None:
    """The session's bytes with its requests packed; None when none repeats enough."""
    whole = [(step, step.exchanges) for step in session.timesteps if step.exchanges]
    for step, exchanges in whole:  # packed in copies: the session's own lists stay whole
        step.exchanges = list(exchanges)
    try:
        shared = _pack_requests(session)
        return encode((session, packed, shared)) if shared else None
    finally:
        for step, exchanges in whole:
            step.exchanges = exchanges


def _pack_requests(session: SessionTrace) -> list[list[int]]:
    """Each request that repeats enough of the one before it to the same system (a judge's
    calls between a policy's do not break the policy's chain) replaced, in its timestep's
    exchanges, by the rest of it: [[exchange number, bytes repeated], ...]."""
    shared: list[list[int]] = []
    before: dict[Any, bytes] = {}
    for number, step, i, system in _requests(session):
        index, request, answer = step.exchanges[i]
        last, before[system] = before.get(system, b""), request
        repeated = _shared_prefix_length(last, request) if len(last) >= SHARED_WORTH else 0
        if repeated >= SHARED_WORTH:
            step.exchanges[i] = (index, request[repeated:], answer)
            shared.append([number, repeated])
    return shared


def _unpack_requests(session: SessionTrace, shared: dict[int, int]) -> None:
    """`_pack_requests` undone."""
    before: dict[Any, bytes] = {}
    for number, step, i, system in _requests(session):
        index, request, answer = step.exchanges[i]
        if number in shared:
            request = before[system][:shared[number]] + request
            step.exchanges[i] = (index, request, answer)
        before[system] = request


def _requests(session: SessionTrace) -> Iterator[tuple[int, Timestep, int, Any]]:
    """(exchange number, its timestep, its place there, whose call it was: its event's
    system) of each exchange, numbered across the session in order, whose request is bytes
    (an app's own record_exchange may have passed text: sent as it is)."""
    number = -1
    for step in session.timesteps:
        events = step.events
        for i, (index, request, _) in enumerate(step.exchanges):
            number += 1
            if type(request) is bytes:
                yield number, step, i, (events[index].system_instance_id if type(index) is int
                                        and 0 <= index < len(events) else None)


def _shared_prefix_length(before: bytes, after: bytes) -> int:
    """How many bytes ``after`` begins with that ``before`` begins with. Searched back
    from the end of ``before``, by doubling steps, then halving: a request usually repeats
    the one before up to its last few bytes, and each test is one memcmp."""
    view = memoryview(before)
    low, high = 0, min(len(before), len(after))  # ``low`` bytes are shared; ``high`` not
    if after.startswith(view[:high]):
        return high
    step = 1
    while high - step > low:
        if after.startswith(view[:high - step]):
            low = high - step
            break
        high, step = high - step, step * 2
    while high - low > 1:
        middle = (low + high) // 2
        if after.startswith(view[:middle]):
            low = middle
        else:
            high = middle
    return low


def encode(value: Any) -> bytes | None:
    """``value`` as msgpack; None when it holds what msgpack has no type for."""
    try:
        return _ENCODER.encode(value)
    except _UNENCODABLE:
        return None


def decode_session(body: bytes, rollout: bytes | None = None) -> SessionTrace:
    """The session ``body`` holds (a journal row's, a log record's), described by what its
    rollout said (``rollout``, an encoded `rollout_description`) when there is one."""
    if body[:1] == _PICKLE:  # written before msgpack
        session = restore(_unpickled(body))
        if rollout is not None:
            session.metadata = with_description(session.metadata, _unpickled(rollout))
        return session
    data, packed, *requests = _DECODER.decode(body)
    session = _build(SessionTrace, data)
    if packed:
        events = [event for step in session.timesteps for event in step.events]
        for n, row in packed:
            events[n].tokens = PackedTurn(row)  # stored as it came (`_rows`)
    if requests:
        _unpack_requests(session, dict(requests[0]))
    if rollout is not None:
        session.metadata = with_description(session.metadata, _DECODER.decode(rollout))
    return session


class _NoClassUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a stored session names {module}.{name}; only "
                                     "builtins are read back")


def _unpickled(data: bytes) -> Any:
    return _NoClassUnpickler(io.BytesIO(data)).load()


_NAMES = {cls: frozenset(names) for cls, names in FIELDS.items()}


def _build(cls: type, data: dict[str, Any]) -> Any:
    # By name, the fields this version knows (an app's subclass may have sent more: the
    # rows have no place for them either).
    values = {name: value for name, value in data.items() if name in _NAMES[cls]}
    for name, sub in NESTED.get(cls, {}).items():
        values[name] = [_build(sub, item) for item in values.get(name, ())]
    if cls is Timestep:
        values["exchanges"] = [tuple(x) for x in values.get("exchanges", ())]
    return cls(**values)


__all__ = ["decode_session", "encode", "encode_session"]
