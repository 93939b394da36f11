"""A session's flat form: tuples of its fields, nested as the dataclasses nest.

How a session msgpack cannot hold (`_codec`) crosses the pipe to the writer child, pickled
(cheaper on the server, whose GIL pays for it, than the dataclasses), and what journal rows
and log records written before msgpack hold, pickled with builtins only: `restore` reads
both back.
"""

from __future__ import annotations

import operator
from dataclasses import fields
from typing import Any

from synth_deploy.tracing._session import (
    Event,
    EventReward,
    Message,
    OutcomeReward,
    SessionTrace,
    Timestep,
)
from synth_deploy.tracing._tokens import PackedTurn, pack_turns


def flatten(session: SessionTrace) -> Any:
    """``session`` as tuples of its fields (`restore` undoes it); a subclass of one of
    the dataclasses stays whole."""
    return _flat(session, SessionTrace)


def restore(flat: Any) -> SessionTrace:
    """The session `flatten` made ``flat`` from."""
    return _restore(flat, SessionTrace)



# The dataclasses' nesting (which field holds a list of which), and their fields' names: what
# the session codec (`_codec`) builds sessions back by, too.
NESTED = {SessionTrace: {"timesteps": Timestep, "event_rewards": EventReward,
                          "outcome_rewards": OutcomeReward},
           Timestep: {"events": Event, "messages": Message}}
FIELDS = {cls: tuple(f.name for f in fields(cls))
           for cls in (SessionTrace, Timestep, Event, Message, EventReward, OutcomeReward)}
_GET = {cls: operator.itemgetter(*names) for cls, names in FIELDS.items()}
_PLAN = {cls: [(i, nested[name]) for i, name in enumerate(FIELDS[cls]) if name in nested]
         for cls, nested in NESTED.items()}


def _flat(obj: Any, cls: type) -> Any:
    if type(obj) is not cls:  # a subclass may hold more than the fields: keep it whole
        return obj
    values = _GET[cls](obj.__dict__)
    plan = _PLAN.get(cls)
    if plan is None:
        return values
    values = list(values)
    for i, sub in plan:
        if sub in _PLAN:
            values[i] = [_flat(x, sub) for x in values[i]]
        else:
            get = _GET[sub]
            values[i] = [get(x.__dict__) if type(x) is sub else x for x in values[i]]
    if cls is SessionTrace:
        _pack_tokens(obj, values[_STEPS_AT])
    return tuple(values)


def _restore(flat: Any, cls: type) -> Any:
    if not isinstance(flat, tuple):
        return flat
    plan = _PLAN.get(cls)
    if plan is None:
        return cls(*flat)
    values = list(flat)
    for i, sub in plan:
        values[i] = [_restore(x, sub) for x in values[i]]
    restored = cls(*values)
    if cls is SessionTrace:
        _unpack_tokens(restored)
    return restored


# Token ids cross packed, each prompt as what it adds to the turn before (`pack_turns`):
# as Python ints, a session's prompts (each holding the conversation so far) would cost the
# server's GIL a pickled int each.
_STEPS_AT, _EVENTS_AT = FIELDS[SessionTrace].index("timesteps"), FIELDS[Timestep].index(
    "events")
_TOKENS_AT = FIELDS[Event].index("tokens")


def _pack_tokens(session: SessionTrace, steps: list[Any]) -> None:
    turns = session.turn_tokens
    if not turns:
        return
    events = [(step[_EVENTS_AT], i) for step in steps if isinstance(step, tuple)
              for i, e in enumerate(step[_EVENTS_AT])
              if isinstance(e, tuple) and e[_TOKENS_AT] is not None]
    if len(events) != len(turns):  # events kept whole hold theirs
        return
    for (where, i), packed in zip(events, pack_turns(turns), strict=True):
        event = where[i]
        where[i] = (*event[:_TOKENS_AT], packed, *event[_TOKENS_AT + 1:])


def _unpack_tokens(session: SessionTrace) -> None:
    for event in session.events:
        if isinstance(event.tokens, tuple):  # as `_pack_tokens` sent it: stored as it is
            event.tokens = PackedTurn(event.tokens)


__all__ = ["FIELDS", "NESTED", "flatten", "restore"]
