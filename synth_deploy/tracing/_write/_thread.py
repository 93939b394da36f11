"""`ThreadWriter`: a process's writes committed by one thread of its own, in groups.

Sessions queued while a commit runs go into the next one (`commit` is one transaction a
batch), so many concurrent writers cost one commit per batch, and there is exactly one
writer per store: "database is locked" cannot happen inside a process. Each write waits on
a waiter the thread settles once its batch has committed: a `concurrent.futures.Future`
(blocking code) or an event loop's future, settled with one thread-safe call per loop and
batch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from typing import Any

from synth_deploy._batches import take_batch
from synth_deploy.errors import TraceStoreError
from synth_deploy.tracing._db._database import TraceDatabase
from synth_deploy.tracing._session import SessionTrace
from synth_deploy.tracing._write._commit import Outcome, commit

MAX_BATCH = 64  # writes (each one or more sessions) taken into one commit at most
_STOP = object()
# What a write waits on: a concurrent future, or (loop, asyncio future) for a coroutine.
Waiter = Any


class ThreadWriter:
    """Commits what is submitted to ``db`` from a thread it starts on the first write.

    Once started, the thread owns closing ``db``: `close` may stop waiting for a slow
    commit, and the batches still queued must not meet a closed connection.
    """

    def __init__(self, db: TraceDatabase) -> None:
        self.db = db
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.closed = False

    def submit(self, sessions: list[SessionTrace], waiter: Waiter) -> None:
        """Queue ``sessions`` (committed together, with whatever else is queued); ``waiter``
        is settled once they are committed, with the first error among them if any."""
        # Checked under the lock `close` holds while it queues the stop marker: a write is
        # either queued ahead of the marker (and committed) or refused here at once.
        with self._lock:
            if self.closed:
                raise TraceStoreError(f"the trace store for {self.db.display} is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="synth-deploy-trace-writer")
                self._thread.start()
            self._queue.put((sessions, waiter))

    def close(self, timeout_s: float | None) -> bool:
        """Commit what is queued and stop the thread (waiting ``timeout_s`` at most).
        False when the thread never started: then closing ``db`` is the caller's."""
        with self._lock:
            if self.closed:
                return True
            self.closed = True
            thread = self._thread
            if thread is not None:
                self._queue.put(_STOP)
        if thread is None:
            return False
        thread.join(timeout_s)
        return True

    def _run(self) -> None:
        try:
            while True:
                item = self._queue.get()
                if item is _STOP:
                    return
                writes, stop = take_batch(self._queue, item, MAX_BATCH, _STOP)
                outcomes = commit(self.db, [s for batch, _ in writes for s in batch])
                settled, at = [], 0
                for batch, waiter in writes:
                    errors = [o for o in outcomes[at:at + len(batch)] if o is not None]
                    settled.append((waiter, errors[0] if errors else None))
                    at += len(batch)
                _settle_all(settled)
                if stop:
                    return
        finally:
            self.db.close()


def _settle_all(pairs: list[tuple[Waiter, Outcome]]) -> None:
    """Settle concurrent futures here, and each loop's futures with one call into it."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Any, Outcome]]] = {}
    for waiter, error in pairs:
        if isinstance(waiter, tuple):
            loop, future = waiter
            by_loop.setdefault(loop, []).append((future, error))
        elif waiter.set_running_or_notify_cancel():
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)
    for loop, futures in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle_in_loop, futures)
        except RuntimeError:
            pass  # the loop is closed: nobody waits for these any more


def _settle_in_loop(futures: list[tuple[asyncio.Future[None], Outcome]]) -> None:
    for future, error in futures:
        if not future.done():  # a write that timed out cancelled its future
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)


def new_waiter() -> concurrent.futures.Future[None]:
    """A waiter for blocking code."""
    return concurrent.futures.Future()


__all__ = ["MAX_BATCH", "ThreadWriter", "new_waiter"]
