"""Noticing an async rollout that holds the event loop.

An ``async def`` rollout runs on the server's event loop: while one of its steps computes
(no ``await`` reached), nothing else runs — not ``/health``, not the other rollouts' policy
calls. `timed_steps` runs a coroutine step by step, noting a step that took longer than
`SLOW_STEP_S`; `LoopWatch` (a task on the same loop) decides whether the loop itself was
held then, and the first time it was for a function, logs one warning that names the function
and the fix.

A step's wall time is not enough: on a busy machine the process waits for a core, and a step
that computed for a millisecond can span a second. The watch wakes every `TICK_S` and takes
from how late it woke the time the thread spent waiting for a core (Linux's run delay, in
/proc/thread-self/schedstat; without it, wall time is all there is).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Generator
from typing import Any

logger = logging.getLogger("synth_deploy.taskapp")

SLOW_STEP_S = 0.1
TICK_S = 0.05
_SCHEDSTAT = "/proc/thread-self/schedstat"
_warned: set[str] = set()


def _run_delay_s() -> float:
    """Seconds this thread has spent runnable but not running (0.0 where Linux does not
    say)."""
    try:
        with open(_SCHEDSTAT, "rb") as stat:
            return int(stat.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


class LoopWatch:
    """The judge of slow steps on one loop: `note` records them, `run` (a task on that loop)
    warns for one only if the loop was held, not the thread kept off a core."""

    def __init__(self) -> None:
        self._slowest: tuple[str, float] | None = None  # since the last tick

    def note(self, name: str, wall_s: float) -> None:
        if self._slowest is None or wall_s > self._slowest[1]:
            self._slowest = (name, wall_s)

    async def run(self) -> None:
        waited = _run_delay_s()
        while True:
            await asyncio.sleep(TICK_S)
            now_waited = _run_delay_s()
            slowest, self._slowest = self._slowest, None
            if slowest is not None:
                # The step ran between two ticks: the thread's wait for a core in that
                # interval is at least what the step's wall time owes to it.
                held_s = slowest[1] - (now_waited - waited)
                if held_s > SLOW_STEP_S:
                    _warn_once(slowest[0], held_s)
            waited = now_waited


def function_name(fn: Any) -> str:
    """A function's name and where it is written (``rollout (apps/x/task_app.py:12)``); a
    callable object is named by its class's ``__call__``."""
    target = fn if hasattr(fn, "__code__") else type(fn).__call__
    name = getattr(target, "__qualname__", repr(fn))
    code = getattr(target, "__code__", None)
    return f"{name} ({code.co_filename}:{code.co_firstlineno})" if code else name


def _warn_once(name: str, held_s: float) -> None:
    if name in _warned:
        return
    _warned.add(name)
    logger.warning(
        "rollout function %s held the event loop for %.2f s without awaiting: /health and "
        "every other rollout waited. CPU work in an async rollout blocks the server: move it "
        "to a worker process (`async with worker_object(Env, ...)`, see the README's \"CPU "
        "work in a rollout\"), or make the rollout a plain `def` (it then runs on a thread, "
        "which still shares the interpreter lock). Said once per function.", name, held_s)


class _TimedSteps:
    """Awaits ``coro`` as a task would, timing each step it runs on the loop."""

    __slots__ = ("coro", "name", "watch")

    def __init__(self, coro: Coroutine[Any, Any, Any], name: str, watch: LoopWatch) -> None:
        self.coro, self.name, self.watch = coro, name, watch

    def __await__(self) -> Generator[Any, Any, Any]:
        send, throw = self.coro.send, self.coro.throw
        clock = time.perf_counter
        value: Any = None
        error: BaseException | None = None
        while True:
            started = clock()
            try:
                yielded = send(value) if error is None else throw(error)
            except StopIteration as done:
                self._check(clock() - started)
                return done.value
            except BaseException:
                self._check(clock() - started)
                raise
            self._check(clock() - started)
            try:
                value, error = (yield yielded), None
            except BaseException as exc:  # cancellation and the deadline, passed on
                value, error = None, exc

    def _check(self, wall_s: float) -> None:
        if wall_s > SLOW_STEP_S:
            self.watch.note(self.name, wall_s)


def timed_steps(fn: Callable[..., Coroutine[Any, Any, Any]], watch: LoopWatch
                ) -> Callable[..., Coroutine[Any, Any, Any]]:
    """``fn`` (an async function), each call's slow steps noted for ``watch`` (see the module
    docstring)."""
    name = function_name(fn)

    async def call(*args: Any) -> Any:
        return await _TimedSteps(fn(*args), name, watch)

    return call


__all__ = ["SLOW_STEP_S", "LoopWatch", "function_name", "timed_steps"]
