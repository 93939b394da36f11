"""Token-level traces: the ids and log-probabilities a policy sampled, per LM call.

On-policy RL trains on the tokens the policy produced, at the log-probabilities it
produced them. Re-tokenizing a conversation is not the inverse of decoding (chat templates
re-render history, BPE merges across turn boundaries, tool calls are reformatted), so a
turn keeps what the policy server said it saw and sampled (`TurnTokens`), and an episode
is checked for continuity: each turn's prompt should begin with the previous turn's prompt
and completion (`continuity_breaks`). Where it does not, a trainer that concatenates the
turns trains on ids the policy never saw.

Stored packed (see `pack_ids`): ids as little-endian uint32, log-probabilities as
little-endian float32 (what vLLM's sampler computes them in), and each prompt as the count
of ids it shares with the previous turn's context plus the ids after them, so an episode's
ids are stored about once.
"""

from __future__ import annotations

import math
import sys
from array import array
from dataclasses import dataclass, field
from typing import Any

# A turn packed: provenance, absent_reason, model, revision, then the ids the prompt shares
# with the previous observed turn's prompt and completion (a count), the prompt's other ids,
# the completion ids, the logprobs (None when there are none), the prompt's and the
# completion's lengths, and where continuity broke (the position and the ids lost, or None).
Packed = tuple[Any, ...]
OBSERVED = "observed_provider"  # the policy server returned them
ABSENT = "unavailable"          # it did not: ``absent_reason`` says what was missing
FLOAT32_MAX = 3.4028234663852886e38  # the largest finite float32


@dataclass
class TurnTokens:
    """One LM call's tokens, as the policy server returned them."""

    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    # One per completion id, or empty when the server returned none.
    completion_logprobs: list[float] = field(default_factory=list)
    model: str | None = None
    revision: str | None = None
    provenance: str = OBSERVED
    absent_reason: str | None = None

    @property
    def observed(self) -> bool:
        return self.provenance == OBSERVED

    def packed(self, context: list[int] | None) -> tuple[Packed, list[int] | None]:
        """This turn as stored (see `pack_turns`), given the previous observed turn's prompt
        and completion; and what the next turn's prompt should begin with."""
        if not self.observed:
            return (self.provenance, self.absent_reason, self.model, self.revision, 0, None,
                    None, None, 0, 0, None, None), context
        prompt = self.prompt_ids
        shared = shared_prefix(context, prompt) if context else 0
        lost = len(context) - shared if context is not None else 0
        logprobs = self.completion_logprobs
        return (self.provenance, self.absent_reason, self.model, self.revision, shared,
                pack_ids(prompt[shared:]), pack_ids(self.completion_ids),
                pack_logprobs(logprobs) if logprobs else None, len(prompt),
                len(self.completion_ids), shared if lost else None, lost or None), \
            prompt + self.completion_ids

    @classmethod
    def absent(cls, reason: str, *, model: str | None = None,
               revision: str | None = None) -> TurnTokens:
        return cls(model=model, revision=revision, provenance=ABSENT, absent_reason=reason)

    @classmethod
    def from_dict(cls, data: Any) -> TurnTokens | None:
        """From `dataclasses.asdict` output (a returned trace): None when ``data`` is None,
        `ValueError` naming the field that is not what a policy server returns."""
        if data is None:
            return None
        if not isinstance(data, dict):
            raise ValueError("not an object")
        turn = cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})
        turn.prompt_ids = valid_ids(turn.prompt_ids, "prompt_ids")
        turn.completion_ids = valid_ids(turn.completion_ids, "completion_ids")
        turn.completion_logprobs = valid_logprobs(turn.completion_logprobs,
                                                  len(turn.completion_ids))
        for name in ("model", "revision", "provenance", "absent_reason"):
            if not isinstance(getattr(turn, name), str | None):
                raise ValueError(f"{name} is not a string")
        return turn


def valid_ids(ids: Any, name: str) -> list[int]:
    """``ids`` as a list, `ValueError` unless each is an integer in [0, 2**32)."""
    if not isinstance(ids, list | tuple) or not all(
            type(i) is int and 0 <= i < 2**32 for i in ids):
        raise ValueError(f"{name} is not an array of token ids (integers from 0 to 2**32-1)")
    return list(ids)


def valid_logprobs(values: Any, count: int) -> list[float]:
    """``values`` as floats, one per completion id (or none); `ValueError` naming the first
    that is not a log-probability: a finite number at most 0 that a float32 (what the store
    keeps) holds. A policy server is whatever a key holder chose, and NaN, infinity (1e400
    reads as one) or a positive value would reach a trainer's loss as data."""
    if not isinstance(values, list | tuple):
        raise ValueError("completion_logprobs is not an array of numbers")
    for i, v in enumerate(values):
        # NaN fails every comparison; an int compares exactly, however long.
        if type(v) not in (int, float) or not -FLOAT32_MAX <= v <= 0:
            raise ValueError(f"completion_logprobs[{i}] is {_shown(v)}, not a "
                             "log-probability (a finite number from -3.4e38 to 0)")
    if values and len(values) != count:
        raise ValueError(f"completion_logprobs has {len(values)} values for {count} "
                         "completion ids; they must align one to one")
    return [float(v) for v in values]


def _shown(value: Any) -> str:
    if type(value) is int and not -10**20 < value < 10**20:  # 1e400 written as an integer
        return "an integer of over 20 digits"  # repr refuses past 4,300
    return repr(value)[:40] if type(value) in (int, float) else type(value).__name__


class PackedTurn(TurnTokens):
    """A turn as the writer child receives it, packed already (`pack_turns`) and stored as
    it came: its ids are never read back into lists there, where nothing reads them."""

    def __init__(self, row: Packed) -> None:
        super().__init__(provenance=row[0], absent_reason=row[1], model=row[2],
                         revision=row[3])
        self.row = row

    def packed(self, context: list[int] | None) -> tuple[Packed, list[int] | None]:
        return self.row, context


@dataclass(frozen=True)
class ContinuityBreak:
    """Turn ``turn`` (1-based, among the turns with token data) did not begin with the
    previous turn's prompt and completion: they agree up to ``position``, and ``ids`` of
    the previous context's ids are not in this prompt where they were."""

    turn: int
    position: int
    ids: int

    def describe(self) -> str:
        return (f"turn {self.turn}: its prompt re-tokenizes the conversation from id "
                f"{self.position} on ({self.ids} of the previous turn's ids are not where "
                "the policy sampled or saw them)")


def shared_prefix(a: list[Any], b: list[Any]) -> int:
    """How many items (ids, messages) ``a`` and ``b`` share from the start."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # the first difference, by halves: prompts run to many thousands of ids
    while lo < hi:
        mid = (lo + hi) // 2
        if a[lo:mid + 1] == b[lo:mid + 1]:
            lo = mid + 1
        else:
            hi = mid
    return lo


def continuity_breaks(turns: list[TurnTokens]) -> list[ContinuityBreak]:
    """Where each observed turn's prompt fails to begin with the previous observed turn's
    prompt and completion. A turn without token data is skipped: the next prompt holds its
    text, which no recorded ids cover, and breaks there."""
    breaks = []
    context: list[int] | None = None
    number = 0
    for turn in turns:
        if not turn.observed:
            continue
        number += 1
        if context is not None:
            shared = shared_prefix(context, turn.prompt_ids)
            if shared < len(context):
                breaks.append(ContinuityBreak(number, shared, len(context) - shared))
        context = turn.prompt_ids + turn.completion_ids
    return breaks


@dataclass(frozen=True)
class TokenSummary:
    """A session's token capture: ``calls`` asked for it, ``observed`` got it; ``sampled``
    completion ids and ``logprobs`` kept; where continuity broke; why data was missing."""

    calls: int
    observed: int
    sampled: int
    logprobs: int
    breaks: tuple[ContinuityBreak, ...] = ()
    absent: tuple[str, ...] = ()

    @property
    def continuous(self) -> bool:
        return not self.breaks

    def describe(self) -> str:
        text = (f"{self.observed} of {self.calls} LM call(s) with token ids · {self.sampled} "
                f"sampled · {self.logprobs} logprobs")
        if self.breaks:
            first = self.breaks[0]
            return (f"{text} · continuity broke at turn {first.turn} (id {first.position}, "
                    f"{first.ids} ids)" + (f" and {len(self.breaks) - 1} more"
                                          if len(self.breaks) > 1 else ""))
        return text + (" · continuity kept" if self.observed > 1 else "")

    def to_dict(self) -> dict[str, Any]:
        return {"calls": self.calls, "observed": self.observed, "sampled": self.sampled,
                "logprobs": self.logprobs, "continuous": self.continuous,
                "breaks": [b.__dict__ for b in self.breaks], "absent": list(self.absent)}


def summarize(turns: list[TurnTokens]) -> TokenSummary:
    observed = [t for t in turns if t.observed]
    return TokenSummary(calls=len(turns), observed=len(observed),
                        sampled=sum(len(t.completion_ids) for t in observed),
                        logprobs=sum(len(t.completion_logprobs) for t in observed),
                        breaks=tuple(continuity_breaks(turns)),
                        absent=tuple(dict.fromkeys(t.absent_reason for t in turns
                                                   if not t.observed and t.absent_reason)))


# -- packed columns ------------------------------------------------------------------------

_BIG_ENDIAN = sys.byteorder == "big"


def pack_ids(ids: list[int]) -> bytes:
    """Little-endian uint32s; `ValueError` for an id outside [0, 2**32)."""
    try:
        packed = array("I", ids)
    except OverflowError:
        raise ValueError("token ids must be integers in [0, 2**32)") from None
    if _BIG_ENDIAN:
        packed.byteswap()
    return packed.tobytes()


def unpack_ids(data: bytes | None) -> list[int]:
    packed = array("I", data or b"")
    if _BIG_ENDIAN:
        packed.byteswap()
    return packed.tolist()


def pack_logprobs(values: list[float]) -> bytes:
    packed = array("f", values)
    if _BIG_ENDIAN:
        packed.byteswap()
    return packed.tobytes()


def unpack_logprobs(data: bytes | None) -> list[float]:
    packed = array("f", data or b"")
    if _BIG_ENDIAN:
        packed.byteswap()
    return packed.tolist()




# A float32's high byte (little-endian: its last) with the sign bit set.
_NEGATIVE_HIGH_BYTES = bytes(range(0x80, 0x100))


def _log_probabilities(packed: bytes, values: list[float]) -> bool:
    """Whether ``values`` (unpacked from the float32s ``packed``) are all finite and at
    most 0 (`valid_logprobs`'s rule), at C speed: every export and page reads them. Finite
    float32s cannot overflow a sum, so an infinite or NaN sum means one is not finite; and
    a set sign bit in each is at most 0."""
    if not values:
        return True
    if not math.isfinite(sum(values)):
        return False
    return not packed[3::4].translate(None, _NEGATIVE_HIGH_BYTES) or max(values) <= 0


def pack_turns(turns: list[TurnTokens]) -> list[Packed]:
    """A session's turns, in order, each prompt as what it adds to the turn before."""
    packed = []
    context: list[int] | None = None
    for t in turns:
        row, context = t.packed(context)
        packed.append(row)
    return packed


def unpack_turns(packed: list[Packed]) -> list[TurnTokens]:
    """`pack_turns` undone (logprobs as float32 values)."""
    turns = []
    context: list[int] = []
    for (provenance, reason, model, revision, shared, rest, completion, logprobs,
         *_) in packed:
        turn = TurnTokens(model=model, revision=revision, provenance=provenance,
                          absent_reason=reason)
        if turn.observed:
            turn.prompt_ids = context[:shared] + unpack_ids(rest)
            turn.completion_ids = unpack_ids(completion)
            turn.completion_logprobs = unpack_logprobs(logprobs)
            if not _log_probabilities(logprobs or b"", turn.completion_logprobs):
                # A store an older kit wrote may hold what a policy server sent: NaN, inf.
                try:
                    valid_logprobs(turn.completion_logprobs, len(turn.completion_ids))
                except ValueError as exc:
                    turn.completion_logprobs = []
                    turn.absent_reason = f"logprobs not kept: the stored {exc}"
            context = turn.prompt_ids + turn.completion_ids
        turns.append(turn)
    return turns


__all__ = ["ABSENT", "OBSERVED", "ContinuityBreak", "PackedTurn", "TokenSummary", "TurnTokens",
           "continuity_breaks", "pack_ids", "pack_logprobs", "pack_turns", "shared_prefix",
           "summarize", "unpack_turns",
           "unpack_ids", "unpack_logprobs", "valid_ids", "valid_logprobs"]
