"""Each message stored once per session: how a session's conversation is kept in its rows.

In memory (and in a returned trace) each timestep holds the whole conversation its policy
call saw, and each call record the whole request: a turn repeats every earlier one, so an
episode of N turns holds about N²/2 messages. Stored, a timestep's messages rows are only
those after the ones it shares with the previous timestep's conversation, the first of them
marked with how many it shares (`SHARED`, in its metadata); and a call record's request
holds only the messages after those it shares with an earlier call's conversation (that
call's request and its reply), naming that call and the count (`EXTENDS`). A history window
that drops old turns shares less, and so stores what it shows each turn, which it bounds.

`compact_steps` and `CallChain.compact` make the stored form; `rebuilt_steps` and
`CallChain.rebuild` undo it (`build_session` and the SFT export read through them). Rows
other writers stored, and rows stored before this form, carry no marks and are read as they
are. synth-ai's readers take the rows as they always were: a messages row is one message
(each once, in order), a call record a JSON object in the ``call_records`` list.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from synth_deploy.tracing._session import chat_reply

SHARED = "_shared_messages"  # message metadata: the timestep's conversation shares this many
EXTENDS = "extends"          # call record: {"event": uid, "messages": count} it continues

T = TypeVar("T")


def shared_count(before: Sequence[Any], now: Sequence[Any], key: Callable[[Any], Any]) -> int:
    """How many leading items of ``now`` equal ``before``'s (compared by ``key``, which
    equal items, and so the same items, agree on)."""
    n = min(len(before), len(now))
    if before[:n] == now[:n]:  # the usual case: one conversation, grown
        return n
    n = 0
    for a, b in zip(before, now, strict=False):
        if a is not b and key(a) != key(b):
            break
        n += 1
    return n


def compact_steps(conversations: Sequence[Sequence[T]], key: Callable[[T], Any]
                  ) -> list[tuple[int, Sequence[T]]]:
    """Each timestep's conversation as (shared, the messages after them): ``shared`` of
    the last non-empty conversation before it lead it. At least one message of a non-empty
    conversation is kept (it carries the mark)."""
    out: list[tuple[int, Sequence[T]]] = []
    previous: Sequence[T] = ()
    for conversation in conversations:
        shared = shared_count(previous, conversation, key) if conversation else 0
        if shared == len(conversation) and shared:  # as `_session._share` leaves it
            shared -= 1
        out.append((shared, conversation[shared:]))
        if conversation:
            previous = conversation
    return out


def rebuilt_steps(stored: Sequence[tuple[int, list[T]]]) -> list[list[T]]:
    """`compact_steps` undone: each timestep's whole conversation."""
    out: list[list[T]] = []
    previous: list[T] = []
    for shared, messages in stored:
        conversation = previous[:shared] + messages if shared else list(messages)
        out.append(conversation)
        if conversation:
            previous = conversation
    return out


def _request_messages(records: Any) -> list[Any] | None:
    if isinstance(records, list) and len(records) == 1 and isinstance(records[0], dict):
        request = records[0].get("request")
        if isinstance(request, dict) and isinstance(request.get("messages"), list):
            return request["messages"]
    return None


def _context(record: dict[str, Any], messages: list[Any]) -> list[Any]:
    """A call's conversation: its request's messages and its reply, as `_session` holds
    them (what the next call's request begins with)."""
    response = record.get("response")
    return [*messages, chat_reply(response)] if isinstance(response, dict) else list(messages)


class CallChain:
    """A session's policy calls in order, each call record stored as what it adds to the
    conversation of the call before it (`compact`), or read back whole (`rebuild`)."""

    def __init__(self) -> None:
        self._last: tuple[str, list[Any]] | None = None  # (event uid, its conversation)
        self._seen: dict[str, list[Any]] = {}

    def compact(self, uid: str, records: Any) -> Any:
        messages = _request_messages(records)
        if messages is None:
            return records
        record = records[0]
        last, self._last = self._last, (uid, _context(record, messages))
        shared = shared_count(last[1], messages, _itself) if last is not None else 0
        if not shared:
            return records
        request = {**record["request"], "messages": messages[shared:]}
        return [{**record, "request": request, EXTENDS: {"event": last[0],
                                                         "messages": shared}}]

    def rebuild(self, uid: str, records: Any) -> Any:
        if isinstance(records, list) and len(records) == 1 and isinstance(records[0], dict) \
                and isinstance(extends := records[0].get(EXTENDS), dict):
            record = records[0]
            base = self._seen.get(extends.get("event"))
            messages = _request_messages(records)
            if base is not None and messages is not None \
                    and isinstance(shared := extends.get("messages"), int):
                record = {k: v for k, v in record.items() if k != EXTENDS}
                record["request"] = {**record["request"],
                                     "messages": base[:shared] + messages}
                records = [record]
        messages = _request_messages(records)
        if messages is not None:
            self._seen[uid] = _context(records[0], messages)
        return records


def _itself(message: Any) -> Any:
    return message


__all__ = ["EXTENDS", "SHARED", "CallChain", "compact_steps", "rebuilt_steps", "shared_count"]
