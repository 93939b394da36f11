"""Environments in worker processes: CPU-bound game state that the server's event loop never
runs.

    async with worker_object(Episode, seed, tier) as episode:   # built in a worker process
        result = await episode.play(actions)                     # run there, result pickled

A pure-Python environment stepped in the server's own process, inline or in a thread, shares
the interpreter lock with the event loop. A busy worker thread holds it for up to the switch
interval (5 ms) each time the loop gives it up for a socket call, so every request the loop
serves (``/health``, the policy calls of every other rollout) waits in line. With 16 Crafter
episodes playing (bench/crafter_rollouts.py, 2 cores), /health p99 was 17-25× its idle value
with one worker thread, 1-3.6× with one worker process: it has its own interpreter, the loop
only sends and receives small messages, and the environments run on another core.

An object lives in one worker for its whole life (its calls run there in order); objects are
spread over up to ``max_workers`` processes, started on demand. The factory, the arguments and
the results must pickle: define the environment in a module next to the task app (the app's
folder is on the worker's path too), not in the task app file. A worker that dies fails the
calls waiting on it with `WorkerError`; the next object goes to a new one.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import json
import os
import pickle
import socket
import subprocess
import sys
import threading
import traceback
import zlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from multiprocessing.connection import Connection
from typing import Any

from synth_deploy.errors import TaskAppError

MAX_DEFAULT_WORKERS = 4
_BOOT = ("import json, sys; sys.path[:0] = json.loads(sys.argv[1]); "
         "from synth_deploy.taskapp.workers import serve_worker; serve_worker(int(sys.argv[2]))")
_ids = itertools.count(1)


class WorkerError(TaskAppError):
    """A worker process could not be reached, could not take the request, or died."""


def default_worker_count() -> int:
    """One process per CPU this process may use, less one for the event loop (1 to 4)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 2
    return max(1, min(MAX_DEFAULT_WORKERS, cpus - 1))


class _Worker:
    """One worker process and the requests waiting on it."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        with theirs:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _BOOT, json.dumps(sys.path), str(theirs.fileno())],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        self.conn = Connection(ours.detach())
        self.pending: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self.objects = 0
        self.alive = True
        # Two locks: the reply reader never waits on a sender blocked on a full socket (the
        # worker would block on its replies in turn).
        self.lock = threading.Lock()  # pending, objects, alive
        self.send_lock = threading.Lock()
        threading.Thread(target=self._read, name=f"worker-{self.process.pid}-replies",
                         daemon=True).start()

    def request(self, op: str, object_id: int, payload: Any) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        try:
            data = pickle.dumps(payload)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise WorkerError(f"cannot send {payload!r:.120} to a worker process: {exc}",
                              hint="define the environment in a module next to the task app, "
                                   "not in the app file or a function") from exc
        request_id = next(_ids)
        with self.lock:
            if not self.alive:
                raise WorkerError(f"worker process {self.process.pid} has exited")
            self.pending[request_id] = (loop, future)
        try:
            with self.send_lock:
                self.conn.send((request_id, op, object_id, data))
        except OSError as exc:
            with self.lock:
                self.pending.pop(request_id, None)
            raise WorkerError(f"worker process {self.process.pid} is gone: {exc}") from exc
        return future

    def _read(self) -> None:
        while True:
            try:
                request_id, ok, value = self.conn.recv()
            except (EOFError, OSError):
                break
            with self.lock:
                waiting = self.pending.pop(request_id, None)
            if waiting is not None:
                _settle_from_thread(*waiting, ok, value)
        with self.lock:
            self.alive = False
            waiting_all, self.pending = list(self.pending.values()), {}
        code = self.process.wait()
        self.conn.close()
        for loop, future in waiting_all:
            _settle_from_thread(loop, future, False, WorkerError(
                f"worker process {self.process.pid} exited (code {code}) during the call"))

    def stop(self) -> None:
        """Ask the worker to exit after its current request; kill it if it does not."""
        try:
            with self.send_lock:
                self.conn.send((0, "stop", 0, b""))
        except OSError:
            pass  # already gone
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)


def _settle_from_thread(loop: asyncio.AbstractEventLoop, future: asyncio.Future, ok: bool,
                        value: Any) -> None:
    try:
        loop.call_soon_threadsafe(_settle, future, ok, value)
    except RuntimeError:  # that loop has closed: nobody waits any more
        pass


def _settle(future: asyncio.Future, ok: bool, value: Any) -> None:
    if future.done():  # the caller gave up (its rollout timed out)
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


class RemoteObject:
    """An object living in a worker process: ``await remote.method(*args)`` runs it there."""

    def __init__(self, worker: _Worker, object_id: int) -> None:
        self._worker, self._id, self._released = worker, object_id, False

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_"):
            raise AttributeError(name)

        async def method(*args: Any, **kwargs: Any) -> Any:
            return await self._worker.request("call", self._id, (name, args, kwargs))

        return method

    def release(self) -> None:
        """Drop the object in its worker (without waiting: it may still be busy with it)."""
        if self._released:
            return
        self._released = True
        with self._worker.lock:
            self._worker.objects -= 1
        if self._worker.alive:
            try:
                self._worker.request("drop", self._id, None).add_done_callback(
                    lambda f: f.cancelled() or f.exception())
            except WorkerError:
                pass  # it died meanwhile: nothing left to drop


class WorkerPool:
    """Worker processes holding objects; started on demand, up to ``max_workers``."""

    def __init__(self, max_workers: int | None = None) -> None:
        self.max_workers = max_workers or default_worker_count()
        self._workers: list[_Worker | None] = [None] * self.max_workers
        self._lock = threading.Lock()

    def _worker_for(self, affinity: Any) -> _Worker:
        with self._lock:
            slots = range(self.max_workers)
            if affinity is not None:  # the same key, the same process (and its caches)
                index = zlib.crc32(repr(affinity).encode()) % self.max_workers
            else:  # the least loaded, a new process before a busy one
                index = min(slots, key=lambda i: (self._workers[i].objects if self._alive(i)
                                                  else 0.5))
            if not self._alive(index):
                self._workers[index] = _Worker()
            worker = self._workers[index]
        with worker.lock:
            worker.objects += 1
        return worker

    def _alive(self, index: int) -> bool:
        worker = self._workers[index]
        return worker is not None and worker.alive

    async def create(self, factory: Callable[..., Any], *args: Any, affinity: Any = None,
                     **kwargs: Any) -> RemoteObject:
        """``factory(*args, **kwargs)`` built in a worker process; ``affinity``: objects with
        the same key go to the same process."""
        worker = self._worker_for(affinity)
        remote = RemoteObject(worker, next(_ids))
        try:
            await worker.request("create", remote._id, (factory, args, kwargs))
        except BaseException:
            remote.release()
            raise
        return remote

    def close(self) -> None:
        with self._lock:
            workers, self._workers = self._workers, [None] * self.max_workers
        for worker in workers:
            if worker is not None:
                worker.stop()


_default: WorkerPool | None = None
_default_lock = threading.Lock()


def default_pool() -> WorkerPool:
    """This process's pool (stopped at exit)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = WorkerPool()
            atexit.register(_default.close)
        return _default


@asynccontextmanager
async def worker_object(factory: Callable[..., Any], *args: Any, affinity: Any = None,
                        pool: WorkerPool | None = None, **kwargs: Any
                        ) -> AsyncIterator[RemoteObject]:
    """``factory(*args, **kwargs)`` in a worker process for the block's duration."""
    remote = await (pool or default_pool()).create(factory, *args, affinity=affinity, **kwargs)
    try:
        yield remote
    finally:
        remote.release()


def serve_worker(fd: int) -> None:
    """The worker process: build objects and run their methods, one request at a time."""
    conn = Connection(fd)
    objects: dict[int, Any] = {}
    while True:
        try:
            request_id, op, object_id, data = conn.recv()
        except (EOFError, OSError):
            return
        if op == "stop":
            return
        try:
            payload = pickle.loads(data)
            if op == "create":
                factory, args, kwargs = payload
                objects[object_id] = factory(*args, **kwargs)
                value = None
            elif op == "call":
                name, args, kwargs = payload
                value = getattr(objects[object_id], name)(*args, **kwargs)
            else:  # "drop"
                objects.pop(object_id, None)
                value = None
            reply = (request_id, True, value)
        except Exception as exc:
            reply = (request_id, False, _portable(exc))
        try:
            conn.send(reply)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            conn.send((request_id, False, _portable(exc)))
        except OSError:  # the server closed its end: it is shutting down
            return


def _portable(exc: BaseException) -> BaseException:
    """``exc`` with the worker's traceback as a note, or a WorkerError when it won't pickle."""
    where = "".join(traceback.format_exception(exc)).rstrip()
    try:
        exc.add_note(f"raised in worker process {os.getpid()}:\n{where}")
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return WorkerError(f"{type(exc).__name__}: {exc} (in worker process {os.getpid()})")


__all__ = ["RemoteObject", "WorkerError", "WorkerPool", "default_pool", "default_worker_count",
           "serve_worker", "worker_object"]
