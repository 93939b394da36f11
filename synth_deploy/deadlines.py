"""`deadline(seconds)`: `asyncio.timeout` for thousands of uses a second.

`asyncio.timeout` arms a timer per use: a heap push, and a cancelled handle left in the
loop's heap until it surfaces. A served app bounds every rollout (mostly by the same
``max_time_s``) and every trace write, so deadlines that fall in the same 50 ms share one
timer: entering costs a set insertion. A deadline fires up to one slot late, never early;
a bounded body that overruns gets `TimeoutError`, exactly as under `asyncio.timeout` (a
cancellation that came from elsewhere still propagates as `CancelledError`). Entering
awaits nothing, so it is a plain ``with`` (as anyio's ``fail_after``): no coroutine objects
made and awaited on the way in and out.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from typing import Any

SLOT_S = 0.05

# Each event loop has its own slots: a timer runs on the loop of the tasks it cancels.
_slots_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop,
                                          dict[int, set[_Deadline]]] = \
    weakref.WeakKeyDictionary()


class _Deadline:
    __slots__ = ("_seconds", "_task", "_slot", "_slots", "_cancelling", "expired")

    def __init__(self, seconds: float | None) -> None:
        self._seconds = seconds
        self._slots: dict[int, set[_Deadline]] = {}  # the loop's slots, once entered
        self._slot = 0
        self.expired = False

    def __enter__(self) -> _Deadline:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("deadline() must be used inside a task")
        self._task, self._cancelling = task, task.cancelling()
        if self._seconds is None or not math.isfinite(self._seconds):
            return self  # no bound
        loop = task.get_loop()
        slots = _slots_by_loop.get(loop)
        if slots is None:
            slots = _slots_by_loop[loop] = {}
        slot = math.ceil((loop.time() + self._seconds) / SLOT_S)
        members = slots.get(slot)
        if members is None:
            members = slots[slot] = set()
            loop.call_at(slot * SLOT_S, _expire, slots, slot)
        members.add(self)
        self._slots, self._slot = slots, slot
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        members = self._slots.get(self._slot)
        if members is not None:
            members.discard(self)
        if self.expired and self._task.uncancel() <= self._cancelling \
                and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc


def _expire(slots: dict[int, set[_Deadline]], slot: int) -> None:
    for member in slots.pop(slot, ()):
        member.expired = True
        member._task.cancel()


def deadline(seconds: float | None) -> _Deadline:
    """``with deadline(s):`` (in a task) raises `TimeoutError` if the body runs past ``s``
    seconds (up to `SLOT_S` later); None: no bound."""
    return _Deadline(seconds)


__all__ = ["SLOT_S", "deadline"]
