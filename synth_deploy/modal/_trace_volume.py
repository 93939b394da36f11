"""The trace Volume: how a deployed app's traces outlive its containers.

Each container records into a SQLite store on its own disk, as `serve` does; a thread of
its own copies that store with SQLite's backup API into a file of this container's on the
app's Modal Volume, then commits the Volume. The copy is a consistent snapshot (the backup
reads one transaction's state), written beside its final name and renamed into place, so
neither our commit nor Modal's background one can catch half a database; each container
writes only its own file, so containers never race on one (on a Volume the last writer of a
file wins). The request path never waits: rollouts commit to the local store, the thread
copies from it.

    <mount>/<app name>/<container id>.db     one per container, whole after every commit

What a killed container can lose is what it recorded since its last snapshot: at most one
interval (``ModalSettings.trace_commit_s``). A container that drains makes a last snapshot
and commit after its last rollout answered.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger("synth_deploy.modal")

TRACE_VOLUME_MOUNT = "/synth-traces"
# What the plan tells the container (plain variables, no secrets).
TRACE_VOLUME_VAR = "SYNTH_TRACE_VOLUME"  # the Volume's name
TRACE_VOLUME_DIR_VAR = "SYNTH_TRACE_VOLUME_DIR"  # where this app's files go on it
TRACE_COMMIT_VAR = "SYNTH_TRACE_COMMIT_S"
DEFAULT_TRACE_COMMIT_S = 10.0
SNAPSHOT_SUFFIX = ".db"
_PARTIAL_SUFFIX = ".db.partial"


def default_trace_volume(app_name: str) -> str:
    """The trace Volume of the Modal app ``app_name`` unless its settings name another."""
    return f"{app_name}-traces"


def modal_volume_commit(name: str) -> Callable[[], None]:
    """Commit the mounted Volume ``name`` (Modal's client, present in every Modal container)."""
    import modal

    volume = modal.Volume.from_name(name)
    return volume.commit


class VolumeSnapshots:
    """Copies the local store ``source`` to ``target`` and commits, every ``every_s`` seconds
    when something changed, and once more at `stop`."""

    def __init__(self, source: Path, target: Path, commit: Callable[[], None],
                 every_s: float) -> None:
        self.source = source
        self.target = target
        self.every_s = every_s
        self.snapshots = 0
        self._commit = commit
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._seen_version: int | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="trace-volume", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.snapshot()

    def snapshot(self) -> bool:
        """Copy and commit if the local store changed since the last copy; False when it had
        not, or the copy failed (logged: traces stay in the local store, the next one retries)."""
        with self._lock:
            try:
                if self._conn is None:
                    if not self.source.exists():
                        return False
                    self._conn = sqlite3.connect(self.source, check_same_thread=False)
                # data_version changes when another connection (the writer) has committed.
                version = self._conn.execute("PRAGMA data_version").fetchone()[0]
                if version == self._seen_version:
                    return False
                self._copy()
                self._commit()
            except Exception as exc:  # the Volume or the disk: the app keeps serving
                logger.warning("trace snapshot to %s failed: %s", self.target, exc)
                return False
            self._seen_version = version
            self.snapshots += 1
            return True

    def _copy(self) -> None:
        assert self._conn is not None
        self.target.parent.mkdir(parents=True, exist_ok=True)
        partial = self.target.with_name(self.target.stem + _PARTIAL_SUFFIX)
        partial.unlink(missing_ok=True)
        out = sqlite3.connect(partial)
        try:
            self._conn.backup(out)
            # A plain rollback-journal file: readable alone, with no -wal/-shm beside it.
            out.execute("PRAGMA journal_mode=DELETE")
        finally:
            out.close()
        os.replace(partial, self.target)

    def stop(self) -> None:
        """The last snapshot and commit (the container drains), then stop."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.every_s + 60)
        self.snapshot()
        with self._lock, contextlib.suppress(sqlite3.Error):
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def with_snapshots(app: Any, snapshots: VolumeSnapshots) -> Any:
    """``app`` whose lifespan starts ``snapshots`` once it is up and makes the last one
    after it has shut down (every rollout answered, every trace in the local store)."""
    import asyncio

    async def traced_app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return

        async def send_after(message: Any) -> None:
            if message["type"] == "lifespan.startup.complete":
                snapshots.start()
            elif message["type"] == "lifespan.shutdown.complete":
                await asyncio.to_thread(snapshots.stop)
            await send(message)

        await app(scope, receive, send_after)

    return traced_app


__all__ = ["DEFAULT_TRACE_COMMIT_S", "SNAPSHOT_SUFFIX", "TRACE_COMMIT_VAR",
           "TRACE_VOLUME_DIR_VAR", "TRACE_VOLUME_MOUNT", "TRACE_VOLUME_VAR",
           "VolumeSnapshots", "default_trace_volume", "modal_volume_commit", "with_snapshots"]
