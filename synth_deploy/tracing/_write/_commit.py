"""`commit`: one batch of sessions into the database, each one's outcome told apart.

The one place that decides what storing a session means, whoever writes (the store's
writer thread, the writer child):

- a batch is one transaction (group commit): many sessions, one commit;
- a session already stored is not stored twice: the same content is a success at once (a
  smoke run storing what the app's own server stored), other content is a
  `SessionConflictError`;
- one bad session fails alone: when a batch cannot be stored, its sessions are committed
  one by one, and only those that fail say so.

A batch is first inserted as it is: sessions are new but for a rewrite, and a session
stored before fails the insert (its id is unique), so the stored ids are looked up only
for a batch that failed, before it is tried again.
"""

from __future__ import annotations

from synth_deploy.tracing._db import _rows
from synth_deploy.tracing._db._database import TraceDatabase
from synth_deploy.tracing._errors import SessionConflictError
from synth_deploy.tracing._session import SessionTrace

Outcome = BaseException | None  # None: stored (or stored before, alike)


def commit(db: TraceDatabase, sessions: list[SessionTrace]) -> list[Outcome]:
    """Store ``sessions``; the outcome of each, in order, once everything is committed."""
    outcomes: list[Outcome] = [None] * len(sessions)
    batch = list(enumerate(sessions))
    try:
        if batch:
            db.insert_sessions(sessions)
    except Exception:
        _commit(db, batch, outcomes)  # a rewrite, a repeated id or a bad session: look
    return outcomes


def _commit(db: TraceDatabase, batch: list[tuple[int, SessionTrace]],
            outcomes: list[Outcome]) -> None:
    repeats: list[tuple[int, SessionTrace]] = []
    try:
        batch, repeats = _without_stored(db, batch, outcomes)
        if batch:
            db.insert_sessions([session for _, session in batch])
    except Exception as exc:
        if len(batch) + len(repeats) == 1:
            outcomes[(batch or repeats)[0][0]] = exc
            return
        for item in batch + repeats:  # one bad session must not fail the others
            _commit(db, [item], outcomes)
        return
    if repeats:  # the same id twice in one batch: compared once the first is stored
        _commit(db, repeats, outcomes)


def _without_stored(db: TraceDatabase, batch: list[tuple[int, SessionTrace]],
                    outcomes: list[Outcome]) -> tuple[list[tuple[int, SessionTrace]],
                                                      list[tuple[int, SessionTrace]]]:
    """``batch`` less the sessions already stored (their outcomes set here), and the
    sessions whose id came earlier in the batch."""
    stored = db.stored_ids(list(dict.fromkeys(s.session_id for _, s in batch)))
    fresh, repeats, seen = [], [], set()
    for item in batch:
        index, session = item
        sid = session.session_id
        if sid in seen:
            repeats.append(item)
        elif sid in stored:
            outcomes[index] = None if _same_as_stored(db, session) else SessionConflictError(
                f"session {sid} is already in {db.display} with different content; nothing "
                "was written", hint="each rollout needs its own session id")
        else:
            seen.add(sid)
            fresh.append(item)
    return fresh, repeats


def _same_as_stored(db: TraceDatabase, session: SessionTrace) -> bool:
    stored = db.session(session.session_id)
    return stored is not None and \
        _rows.insert_statements([stored]) == _rows.insert_statements([session])


__all__ = ["Outcome", "commit"]
