"""`merge_trace_file`: the sessions of another trace file, added to a store.

A session is identified by its id everywhere (one rollout, one id), so a session the store
already holds is skipped, not compared: merging the same file twice, or a newer copy of a
file merged before, adds only what is new. Each batch is one commit, so a merge cut short
keeps the batches it finished and the next merge picks up from there.

Sessions still in the file's journal (a Modal container's segment holds nothing else:
`TraceDbSetting.journal_all`) are read from it and stored in rows here once, not built in
the file first and read back, which would store each twice.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from synth_deploy.tracing._config import parse_trace_db
from synth_deploy.tracing._db._database import TraceDatabase
from synth_deploy.tracing._session import SessionTrace
from synth_deploy.tracing._store import TraceStore
from synth_deploy.tracing._write import _journal

logger = logging.getLogger("synth_deploy.tracing")

MERGE_BATCH = 200


@dataclass(frozen=True)
class MergeResult:
    """What one merge did: sessions ``added`` to the store and ``skipped`` (already there);
    ``probe``, one session of the file (None: it held none), by which a caller can tell
    later whether the store still holds what it merged."""

    added: int
    skipped: int
    probe: str | None = None

    @property
    def sessions(self) -> int:
        return self.added + self.skipped


def merge_trace_file(store: TraceStore, source: str | os.PathLike[str]) -> MergeResult:
    """Add to ``store`` every session of the SQLite trace file ``source`` it does not hold.

    ``source`` is opened read-only and left as it is; any schema version this code reads
    will do. Raises `TraceStoreError` (with a hint) when ``source`` is not a trace file.
    """
    other = TraceDatabase(parse_trace_db(os.fspath(source)), create=False, read_only=True)
    merge = _Merge(store)
    try:
        ids = [row[0] for row in other.rows(
            "SELECT session_id FROM session_traces ORDER BY created_at, session_id")]
        for start in range(0, len(ids), MERGE_BATCH):
            batch = ids[start:start + MERGE_BATCH]
            merge.add(batch, lambda new: [s for s in map(other.session, new) if s is not None])
        after = 0
        while rows := _journal.entries(other, after=after, limit=MERGE_BATCH):
            after = rows[-1][0]
            bodies = {session_id: (seq, body, rollout) for seq, session_id, body, rollout
                      in reversed(rows)}  # a session journaled twice: its first row
            merge.add(list(bodies), lambda new, b=bodies: _decoded(other, new, b))
    finally:
        other.close()
    return MergeResult(added=merge.added, skipped=merge.skipped, probe=merge.last)


class _Merge:
    """Adds batches of sessions to ``store``, each one commit, skipping those it holds or
    this merge has seen."""

    def __init__(self, store: TraceStore) -> None:
        self.store, self.added, self.skipped = store, 0, 0
        self.last: str | None = None
        self._seen: set[str] = set()

    def add(self, ids: list[str], read: Callable[[list[str]], list[SessionTrace]]) -> None:
        ids = [i for i in ids if i not in self._seen]
        if not ids:
            return
        self._seen.update(ids)
        held = self.store.database.stored_ids(ids)
        new = read([i for i in ids if i not in held])
        if new:
            self.store.write_sessions_sync(new)
        self.added += len(new)
        self.skipped += len(ids) - len(new)
        self.last = ids[-1]


def _decoded(db: TraceDatabase, ids: list[str],
             bodies: dict[str, tuple[int, bytes, bytes | None]]) -> list[SessionTrace]:
    sessions = []
    for session_id in ids:
        seq, body, rollout = bodies[session_id]
        try:
            sessions.append(_journal.decode(body, rollout))
        except Exception as exc:  # nothing of ours writes such a row: say so, go on
            logger.error("%s: journal row %d (session %s) cannot be read back (%s); it was "
                         "not merged", db.display, seq, session_id, exc)
    return sessions


__all__ = ["MergeResult", "merge_trace_file"]
