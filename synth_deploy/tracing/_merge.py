"""`merge_trace_file`: the sessions of another trace file, added to a store.

A session is identified by its id everywhere (one rollout, one id), so a session the store
already holds is skipped, not compared: merging the same file twice, or a newer copy of a
file merged before, adds only what is new. Each batch is one commit, so a merge cut short
keeps the batches it finished and the next merge picks up from there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from synth_deploy.tracing._store import TraceStore, open_trace_store

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
    added = skipped = 0
    with open_trace_store(source, create=False, read_only=True) as other:
        ids = [row[0] for row in other.database.rows(
            "SELECT session_id FROM session_traces ORDER BY created_at, session_id")]
        for start in range(0, len(ids), MERGE_BATCH):
            batch = ids[start:start + MERGE_BATCH]
            held = store.database.stored_ids(batch)
            new = [s for s in (other.database.session(i) for i in batch if i not in held)
                   if s is not None]
            if new:
                store.write_sessions_sync(new)
            added += len(new)
            skipped += len(batch) - len(new)
    return MergeResult(added=added, skipped=skipped, probe=ids[-1] if ids else None)


__all__ = ["MergeResult", "merge_trace_file"]
