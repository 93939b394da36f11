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
of the session.

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


def encode_session(session: SessionTrace) -> bytes | None:
    """``session`` as the log keeps it; None when it holds what msgpack has no type for."""
    with_tokens = [(n, event) for n, event in enumerate(
        event for step in session.timesteps for event in step.events)
        if event.tokens is not None]
    if not with_tokens:
        return encode((session, None))
    turns = [event.tokens for _, event in with_tokens]
    packed = [[n, row] for (n, _), row in zip(with_tokens, pack_turns(turns), strict=True)]
    for _, event in with_tokens:  # sent packed, beside the session: out of it meanwhile
        event.tokens = None
    try:
        return encode((session, packed))
    finally:
        for (_, event), tokens in zip(with_tokens, turns, strict=True):
            event.tokens = tokens


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
    data, packed = _DECODER.decode(body)
    session = _build(SessionTrace, data)
    if packed:
        events = [event for step in session.timesteps for event in step.events]
        for n, row in packed:
            events[n].tokens = PackedTurn(row)  # stored as it came (`_rows`)
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
