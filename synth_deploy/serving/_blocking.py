"""Noticing an async rollout that holds the event loop.

An ``async def`` rollout runs on the server's event loop: while one of its steps computes
(no ``await`` reached), nothing else runs — not ``/health``, not the other rollouts' policy
calls. `timed_steps` runs a coroutine step by step and, the first time a step of a function
holds the loop longer than `SLOW_STEP_S`, logs one warning that names the function and the
fix. It measures only what the function does between its awaits; the loop itself is not
touched.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Coroutine, Generator
from typing import Any

logger = logging.getLogger("synth_deploy.taskapp")

SLOW_STEP_S = 0.1
_warned: set[str] = set()


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

    __slots__ = ("coro", "name")

    def __init__(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        self.coro = coro
        self.name = name

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

    def _check(self, held_s: float) -> None:
        if held_s > SLOW_STEP_S:
            _warn_once(self.name, held_s)


def timed_steps(fn: Callable[..., Coroutine[Any, Any, Any]]
                ) -> Callable[..., Coroutine[Any, Any, Any]]:
    """``fn`` (an async function), each call's steps timed (see the module docstring)."""
    name = function_name(fn)

    async def call(*args: Any) -> Any:
        return await _TimedSteps(fn(*args), name)

    return call


__all__ = ["SLOW_STEP_S", "function_name", "timed_steps"]
