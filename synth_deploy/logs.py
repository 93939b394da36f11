"""`CoalescedLog`: a failure that repeats on every request, logged once with a count.

A served app can fail the same way on every request for as long as its cause lasts (a full
disk under the trace store, a database another process holds). Logged per request, that is
one traceback per request, thousands a minute, burying everything else and filling the disk
further. Coalesced, the first failure of a kind is logged whole, with its traceback, and the
ones that follow are counted and said in one line at most once a window:

    trace_failures = CoalescedLog(logger, every_s=60)
    ...
    except TraceStoreError as exc:
        trace_failures.error(exc, "trace write failed for rollout %s", run_id)

logs ``trace write failed for rollout r1`` with its traceback, then, for the next failure
60 s or more later, ``trace write failed for rollout r812 (TraceStoreError: ...: again 811
times in the last 60s)``. A kind is the exception's type and message, or what the caller
says it is (a rollout's failures: the type and the line that raised it). A caller whose
exceptions may carry secrets passes ``redact``: what is logged of the exception, traceback
included, goes through it first.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

MAX_KINDS = 64  # kinds remembered at once; the one seen longest ago is forgotten first


@dataclass
class _Kind:
    said_at: float
    since_said: int = 0  # failures of this kind not logged since ``said_at``


class CoalescedLog:
    """Logs each kind of failure once, then at most once every ``every_s`` seconds with how
    many times it happened since (see the module docstring). Thread-safe."""

    def __init__(self, logger: logging.Logger, *, every_s: float = 60.0,
                 level: int = logging.ERROR, tracebacks: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger, self.every_s, self.level, self._clock = logger, every_s, level, clock
        self.tracebacks = tracebacks
        self._kinds: OrderedDict[tuple[type, str], _Kind] = OrderedDict()
        self._lock = threading.Lock()

    def error(self, exc: BaseException, message: str, *args: object, kind: str | None = None,
              redact: Callable[[str], str] | None = None) -> None:
        """Log ``message % args`` for ``exc``: whole (traceback included, unless the log was
        made without) the first time its kind is seen, as one counted line when ``every_s``
        has passed, else not at all. ``kind``: what tells failures apart (default: the
        exception's message); ``redact``: applied to the exception's text before it is
        logged."""
        key = (type(exc), str(exc) if kind is None else kind)
        now = self._clock()
        with self._lock:
            seen = self._kinds.get(key)
            if seen is None:
                self._kinds[key] = _Kind(said_at=now)
                if len(self._kinds) > MAX_KINDS:
                    self._kinds.popitem(last=False)
                first, count, window = True, 0, 0.0
            else:
                self._kinds.move_to_end(key)
                seen.since_said += 1
                if now - seen.said_at < self.every_s:
                    return
                first, count, window = False, seen.since_said, now - seen.said_at
                seen.said_at, seen.since_said = now, 0
        if not first:
            said = str(exc) if redact is None else redact(str(exc))
            self.logger.log(self.level, f"{message} ({type(exc).__name__}: %s: again %d "
                            f"times in the last %.0fs)", *args, said, count, window)
        elif not self.tracebacks:
            self.logger.log(self.level, message, *args)
        elif redact is None:
            self.logger.log(self.level, message, *args, exc_info=exc)
        else:  # the traceback as text, so that it is redacted like the rest
            text = "".join(traceback.format_exception(exc)).rstrip("\n")
            self.logger.log(self.level, f"{message}\n%s", *args, redact(text))


__all__ = ["CoalescedLog"]
