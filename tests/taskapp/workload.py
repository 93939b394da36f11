"""Objects for tests/taskapp/test_workers.py to build in worker processes (they must be
importable there, so they live in a module of their own)."""

from __future__ import annotations

import os
import time


class Counter:
    def __init__(self, start: int = 0) -> None:
        self.total = start

    def add(self, n: int) -> int:
        self.total += n
        return self.total

    def pid(self) -> int:
        return os.getpid()

    def spin(self, seconds: float) -> float:
        """Pure-Python work that holds this process's GIL, as an environment step does."""
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            sum(range(200))
        return seconds

    def fail(self) -> None:
        raise LookupError("no such seed")

    def die(self) -> None:
        os._exit(3)
