"""`merge_trace_file`: the sessions of another trace file, added to a store.

A session is identified by its id everywhere (one rollout, one id), so a session the store
already holds is skipped, not compared: merging the same file twice, or a newer copy of a
file merged before, adds only what is new. One later change is carried: a lost answer
(`lost_answer`: the client never got the session's ``ok``), which a container records
after the session may have gone home in an earlier file. Each batch is one commit, so a
merge cut short keeps the batches it finished and the next merge picks up from there.

A file may also be a session log (`_write._log`: what a Modal container copies to its
Volume of its store's log, `TraceDbSetting.session_log`), and a SQLite file may hold
sessions in its journal: either way each session is decoded and stored in rows here once,
not built in the file first and read back, which would store each twice.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from synth_deploy.tracing._config import parse_trace_db
from synth_deploy.tracing._db._database import TraceDatabase
from synth_deploy.tracing._db._schema import AMENDMENTS_TABLE, JOURNAL_VERSION
from synth_deploy.tracing._errors import TraceFormatError
from synth_deploy.tracing._rollout_facts import lost_answer
from synth_deploy.tracing._session import SessionTrace
from synth_deploy.tracing._store import TraceStore
from synth_deploy.tracing._write import _journal
from synth_deploy.tracing._write._codec import decode_session
from synth_deploy.tracing._write._log import is_session_log, read_session_log

logger = logging.getLogger("synth_deploy.tracing")

MERGE_BATCH = 200


@dataclass(frozen=True)
class MergeResult:
    """What one merge did: sessions ``added`` to the store and ``skipped`` (already there);
    ``probe``, one session of the file, or that it marks (None: neither), by which a caller
    can tell later whether the store still holds what it merged; ``amended``, the sessions
    the store held as ``ok`` whose answer the file says was lost (errors now)."""

    added: int
    skipped: int
    probe: str | None = None
    amended: int = 0

    @property
    def sessions(self) -> int:
        return self.added + self.skipped


def merge_trace_file(store: TraceStore, source: str | os.PathLike[str]) -> MergeResult:
    """Add to ``store`` every session of the trace file ``source`` it does not hold: a
    SQLite store, or a session log (a Modal container's copy of one).

    ``source`` is opened read-only and left as it is; any schema version this code reads
    will do. Raises `TraceStoreError` (with a hint) when
    ``source`` is not a trace file.
    """
    if os.path.isfile(source) and is_session_log(source):
        return _merge_log(store, source)
    other = TraceDatabase(parse_trace_db(os.fspath(source)), create=False, read_only=True)
    merge = _Merge(store)
    try:
        ids = [row[0] for row in other.rows(
            "SELECT session_id FROM session_traces ORDER BY created_at, session_id")]
        for start in range(0, len(ids), MERGE_BATCH):
            batch = ids[start:start + MERGE_BATCH]
            held = merge.add(batch, lambda new: [s for s in map(other.session, new)
                                                 if s is not None])
            merge.carry_lost_answers(other, held)
        after = 0
        while rows := _journal.entries(other, after=after, limit=MERGE_BATCH):
            after = rows[-1][0]
            bodies = {session_id: (f"journal row {seq}", body, rollout) for seq, session_id,
                      body, rollout in reversed(rows)}  # journaled twice: its first row
            merge.add(list(bodies), lambda new, b=bodies: _decoded(other.display, new, b))
        # Lost answers the file holds apart from its sessions (a container's marks; the
        # table came with the journal).
        if other.schema_version >= JOURNAL_VERSION:
            merge.mark_lost(other.rows(f"SELECT session_id, error FROM {AMENDMENTS_TABLE}"))
    finally:
        other.close()
    return MergeResult(added=merge.added, skipped=merge.skipped, probe=merge.last,
                       amended=merge.amended)


class _Merge:
    """Adds batches of sessions to ``store``, each one commit, skipping those it holds or
    this merge has seen."""

    def __init__(self, store: TraceStore) -> None:
        self.store, self.added, self.skipped, self.amended = store, 0, 0, 0
        self.last: str | None = None
        self._seen: set[str] = set()

    def add(self, ids: list[str], read: Callable[[list[str]], list[SessionTrace]]
            ) -> set[str]:
        """Add the sessions of ``ids`` the store does not hold (``read`` reads them from
        the file); those it held."""
        ids = [i for i in ids if i not in self._seen]
        if not ids:
            return set()
        self._seen.update(ids)
        held = self.store.database.stored_ids(ids)
        new = read([i for i in ids if i not in held])
        if new:
            self.store.write_sessions_sync(new)
        self.added += len(new)
        self.skipped += len(ids) - len(new)
        self.last = ids[-1]
        return held

    def carry_lost_answers(self, source: TraceDatabase, held: set[str]) -> None:
        """Mark lost the answers of the ``held`` sessions that ``source`` stores as lost
        (only a lost answer turns a stored ``ok`` session into an error)."""
        if held:
            self.mark_lost(source.rows(
                "SELECT session_id, json_extract(metadata, '$.error') FROM session_traces "
                "WHERE session_id IN (SELECT value FROM json_each(?)) AND "
                "json_valid(metadata) AND json_extract(metadata, '$.status') = 'error'",
                (json.dumps(sorted(held)),)))

    def mark_lost(self, lost: list[tuple[str, str | None]]) -> None:
        """Record the lost answers ``lost`` ((session id, its error as JSON) each) in the
        store: sessions it holds as ``ok`` become errors (counted), the others get it when
        they come."""
        if not lost:
            return
        if self.last is None:  # a file of marks only: the probe is a session it marks
            self.last = lost[-1][0]
        ok = {row[0] for row in self.store.database.rows(
            "SELECT session_id FROM session_traces WHERE session_id IN (SELECT value FROM "
            "json_each(?)) AND json_valid(metadata) AND json_extract(metadata, '$.status') "
            "= 'ok'", (json.dumps([session_id for session_id, _ in lost]),))}
        self.store.database.run([
            statement for session_id, error in lost for statement in lost_answer(
                session_id, json.loads(error) if error else {"code": "answer_lost"})])
        self.amended += len(ok)


def _merge_log(store: TraceStore, source: str | os.PathLike[str]) -> MergeResult:
    read = read_session_log(source)
    if read.end < read.size:  # the copier writes whole records only: a damaged copy
        raise TraceFormatError(f"{os.fspath(source)}: its last {read.size - read.end} bytes "
                               "are not a whole session", hint="fetch the file again")
    merge = _Merge(store)
    for start in range(0, len(read.records), MERGE_BATCH):
        bodies: dict[str, tuple[str, bytes, bytes | None]] = {}
        for n, (session_id, body, rollout) in enumerate(
                read.records[start:start + MERGE_BATCH], start + 1):
            bodies.setdefault(session_id, (f"record {n}", body, rollout))  # logged twice
        merge.add(list(bodies), lambda new, b=bodies: _decoded(os.fspath(source), new, b))
    return MergeResult(added=merge.added, skipped=merge.skipped, probe=merge.last)


def _decoded(where: str, ids: list[str],
             bodies: dict[str, tuple[str, bytes, bytes | None]]) -> list[SessionTrace]:
    """The sessions ``ids`` from ``bodies`` ((which, body, rollout) each by id)."""
    sessions = []
    for session_id in ids:
        which, body, rollout = bodies[session_id]
        try:
            sessions.append(decode_session(body, rollout))
        except Exception as exc:  # nothing of ours writes such a thing: say so, go on
            logger.error("%s: %s (session %s) cannot be read back (%s); it was not merged",
                         where, which, session_id, exc)
    return sessions


__all__ = ["MergeResult", "merge_trace_file"]
