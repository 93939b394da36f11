"""Noticing app code that holds the event loop, and naming it.

An ``async def`` rollout, or an environment's async ``reset``/``step``, runs on the server's
event loop: while it computes (no ``await`` reached), nothing else runs — not ``/health``,
not the other rollouts' policy calls.

`LoopWatch` measures the loop itself. Its heartbeat (a task on the loop) asks to wake every
`TICK_S`; how late it wakes is how long the loop could not run it, bounded by the CPU time
the loop's thread used meanwhile: a thread kept off its core by other processes, or waiting
for the interpreter lock that a worker thread holds, computes nothing and holds nothing.
Wall time alone would blame an app on a busy machine for the machine; Linux's run delay alone
(time spent waiting for a core) misses the lock, and costs a /proc read a beat.

Whose code held it: while the heartbeat is late, a thread looks at the loop thread's Python
stack. Going out from the innermost frame past the standard library and installed packages, the
first frame is either the kit's (then the kit held the loop, and the app is never told) or the
app's (an app installed as a package is told apart by where its rollout and environment are
written, `app_code`); of the app's frames above the kit, the outermost is named (the rollout
function, an environment's ``step``), with where it was. A hold more than `HELD_S` long, most of
whose looks saw the same function, is warned about once per function.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import sys
import sysconfig
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

logger = logging.getLogger("synth_deploy.taskapp")

HELD_S = 0.1
TICK_S = 0.025
LOOK_S = 0.02  # how often the thread checks the heartbeat

_KIT = str(Path(__file__).resolve().parents[1])
_LIBRARY = tuple({str(Path(p).resolve()) for name in ("stdlib", "platstdlib", "purelib",
                                                       "platlib")
                  if (p := sysconfig.get_paths().get(name))})
_APP, _KIT_CODE, _LIBRARY_CODE = "app", "kit", "library"


def _held_s(late_s: float, cpu_s: float) -> float:
    """How long the loop's own code held it: its heartbeat ``late_s`` late, its thread having
    used ``cpu_s`` of CPU since the beat before."""
    return min(late_s, cpu_s)


_SITE = tuple({str(Path(p).resolve()) for name in ("purelib", "platlib")
               if (p := sysconfig.get_paths().get(name))})


def app_code(*objects: object) -> list[str]:
    """Where the app's own code lives when it is installed as a package: the folder of each
    of ``objects``' top-level package (its module's file for a lone module), for those in
    site-packages. Elsewhere the app's code is told apart by where it is not."""
    roots = []
    for obj in objects:
        obj = inspect.unwrap(getattr(obj, "func", obj))  # a partial's, a decorator's
        module = getattr(obj, "__module__", None) or getattr(type(obj), "__module__", None)
        top = sys.modules.get((module or "").partition(".")[0])
        file = getattr(top, "__file__", None)
        if not file or not isinstance(module, str) or module.startswith("synth_deploy"):
            continue
        path = Path(file).resolve()
        root = str(path.parent if path.name == "__init__.py" else path)
        if root.startswith(_SITE) and root not in roots:
            roots.append(root)
    return roots


class _Owners:
    """Whose code a file holds: the app's, the kit's or a library's (cached a file).
    ``app_roots``: the app's own code (`app_code`), the app's even inside site-packages."""

    def __init__(self, app_roots: Iterable[str] = ()) -> None:
        self._app = tuple(root.rstrip("/") for root in app_roots)
        self._kinds: dict[str, str] = {}

    def __call__(self, filename: str) -> str:
        kind = self._kinds.get(filename)
        if kind is None:
            path = filename if filename.startswith("<") else str(Path(filename).resolve())
            kind = self._kinds[filename] = (
                _APP if any(path == root or path.startswith(root + "/")
                            for root in self._app)
                else _KIT_CODE if path.startswith(_KIT + "/")
                else _LIBRARY_CODE if path.startswith("<") or path.startswith(_LIBRARY)
                else _APP)
        return kind


@dataclass(frozen=True)
class Culprit:
    """The app's call that was running: ``entry``, its outermost frame above the kit;
    ``function``, that frame's function and where it is written; ``where``, the line the
    innermost of the app's frames was at ("at line 12", "in burn at work.py:7")."""

    entry: FrameType
    function: str
    where: str


def _culprit(frame: FrameType | None, owner_of: _Owners) -> Culprit | None:
    """The app's call the stack ending at ``frame`` is in, or None when the innermost code
    that is not a library's is the kit's."""
    while frame is not None and owner_of(frame.f_code.co_filename) == _LIBRARY_CODE:
        frame = frame.f_back
    if frame is None or owner_of(frame.f_code.co_filename) == _KIT_CODE:
        return None
    innermost = entry = frame
    while frame is not None and (owner := owner_of(frame.f_code.co_filename)) != _KIT_CODE:
        if owner == _APP:
            entry = frame
        frame = frame.f_back
    code = entry.f_code
    where = (f"at line {innermost.f_lineno}" if innermost is entry else
             f"in {innermost.f_code.co_qualname} at "
             f"{innermost.f_code.co_filename}:{innermost.f_lineno}")
    return Culprit(entry, f"{code.co_qualname} ({code.co_filename}:{code.co_firstlineno})",
                   where)


@dataclass(frozen=True)
class _Hold:
    """What the thread saw while one heartbeat was late: each app function's looks, and
    all. Never changed once made: the loop reads it while the thread makes the next."""

    beat: tuple[float, float]
    looks: int = 0
    seen: dict[int, tuple[Culprit, int]] = field(default_factory=dict)

    def saw(self, found: Culprit | None) -> _Hold:
        seen = dict(self.seen)
        if found is not None:  # by function: rollouts that start together run back to back
            key = id(found.entry.f_code)
            seen[key] = (found, seen.get(key, (found, 0))[1] + 1)
        return _Hold(self.beat, self.looks + 1, seen)

    def blamed(self) -> Culprit | None:
        """The app function seen in most looks, if that is more than half of them."""
        best = max(self.seen.values(), key=lambda seen: seen[1], default=None)
        return best[0] if best is not None and 2 * best[1] > self.looks else None


class LoopWatch:
    """The judge of one loop: `run` it as a task on that loop. ``app_roots``: where the
    app's code lives if it is installed as a package (`app_code`)."""

    def __init__(self, app_roots: Iterable[str] = ()) -> None:
        self._owner_of = _Owners(app_roots)
        self._warned: set[str] = set()
        self._beat: tuple[float, float] = (time.perf_counter(), time.thread_time())
        self._hold: _Hold | None = None

    async def run(self) -> None:
        stop = threading.Event()
        looker = threading.Thread(target=self._look, args=(threading.get_ident(), stop),
                                  daemon=True, name="synth-deploy loop watch")
        self._beat = (time.perf_counter(), time.thread_time())
        looker.start()
        try:
            while True:
                await asyncio.sleep(TICK_S)
                beat, now = self._beat, (time.perf_counter(), time.thread_time())
                held = _held_s(now[0] - beat[0] - TICK_S, now[1] - beat[1])
                hold, self._hold = self._hold, None
                self._beat = now
                if held > HELD_S and hold is not None and hold.beat is beat:
                    found = hold.blamed()
                    if found is not None:
                        self._warn_once(found, held)
        finally:
            stop.set()
            self._hold = None

    def _look(self, ident: int, stop: threading.Event) -> None:
        """The thread: while the heartbeat is late, whose code the loop runs."""
        while not stop.wait(LOOK_S):
            beat = self._beat
            if time.perf_counter() - beat[0] - TICK_S <= LOOK_S:
                continue
            found = _culprit(sys._current_frames().get(ident), self._owner_of)
            hold = self._hold
            hold = (hold if hold is not None and hold.beat is beat else _Hold(beat)).saw(found)
            if self._beat is beat:  # else the loop moved on while we looked
                self._hold = hold
            del found, hold  # no frame kept alive between looks

    def _warn_once(self, found: Culprit, held: float) -> None:
        if found.function in self._warned:
            return
        self._warned.add(found.function)
        logger.warning(
            "%s held the event loop for %.2f s without awaiting (%s): /health and every other "
            "rollout waited. CPU work in async code blocks the server: move it to a worker "
            "process (`async with worker_object(Env, ...)`, see the README's \"CPU work in a "
            "rollout\"), or make the function a plain `def` (the kit runs a plain rollout or "
            "environment method on a thread, which still shares the interpreter lock). Said "
            "once per function.", found.function, held, found.where)


__all__ = ["HELD_S", "LoopWatch", "app_code"]
