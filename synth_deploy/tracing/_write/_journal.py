"""The journal: a busy writer child stores whole sessions first and builds their rows later.

A five-call session is some seventeen rows of the indexed v3 tables (events and messages,
their indexes, the totals triggers): most of what tracing costs a served app. While its
server is busy (its CPU is what rollouts are answered with) and sessions come together (a
batch of several, or other rollouts still running), the writer child stores each one as a
single row of `JOURNAL_TABLE` instead: the session as the server encoded it (`_codec`),
untouched, and what the rollout's facts say of it (`rollout_description`: keys masked here,
so no secret reaches the file). That commit is what the child acknowledges, so a journaled
session is as durable as one stored in rows. Building its rows later costs more than
building them at once (the row is read back, a second transaction), so a server with CPU to
spare gets rows at once. A store whose readers are elsewhere (a Modal container's) keeps
what a journal row holds in its session log instead (`_log`), which `traces pull` decodes at
home as it decodes journal rows.

Its rows are built (`expand`) between batches while the server is not busy (the writer child
watches the share of a core it uses), for `EXIT_BUILD_S` at most once the child's input
closes, and by any `TraceStore` when it opens and before it reads: every reader of the kit
sees every acknowledged session. A stopping server waits a moment at most: the next store to
open the file builds the rest. A program that reads the tables itself (synth-ai) sees a
session once its rows are built. Building is `commit`, so a session already stored is not
stored twice, and a crash between building and dropping the journal row leaves nothing to
lose.

Only what msgpack holds goes in (any other session is stored in rows at once), and what is
read back names no class, so a journal row cannot run code.
"""

from __future__ import annotations

import json
import logging
import time

from synth_deploy.tracing._db._database import TraceDatabase
from synth_deploy.tracing._db._schema import JOURNAL_TABLE, JOURNAL_VERSION
from synth_deploy.tracing._write._codec import decode_session
from synth_deploy.tracing._write._commit import commit

logger = logging.getLogger("synth_deploy.tracing")

# How often a writer child with a journal looks again whether its server is still busy.
IDLE_S = 0.050
# Sessions built in one transaction: a batch that arrives meanwhile waits for one chunk.
CHUNK = 16
# How long a writer child whose input closed goes on building rows before it exits.
EXIT_BUILD_S = 2.0


def append(db: TraceDatabase, entries: list[tuple[str, bytes, bytes | None]]) -> None:
    """Journal ``entries`` ((session id, session and `rollout_description` or None, each
    encoded by `_codec`) each) in one transaction."""
    db.run([(f"INSERT INTO {JOURNAL_TABLE} (session_id, body, rollout) VALUES (?, ?, ?)",
             entry) for entry in entries])


def waiting(db: TraceDatabase) -> int:
    """How many sessions the journal holds (0 for a store older than the journal)."""
    if db.schema_version < JOURNAL_VERSION:
        return 0
    return int(db.rows(f"SELECT COUNT(*) FROM {JOURNAL_TABLE}")[0][0])


def any_waiting(db: TraceDatabase) -> bool:
    """Whether the journal holds a session (one index probe, however many it holds)."""
    if db.schema_version < JOURNAL_VERSION:
        return False
    return bool(db.rows(f"SELECT EXISTS (SELECT 1 FROM {JOURNAL_TABLE})")[0][0])


def entries(db: TraceDatabase, *, after: int = 0, limit: int = CHUNK,
            session_id: str | None = None) -> list[tuple[int, str, bytes, bytes | None]]:
    """Up to ``limit`` journal rows past ``after``, oldest first (``session_id``: that
    session's only): (seq, session id, body, rollout) each, for `decode_session`."""
    if db.schema_version < JOURNAL_VERSION:
        return []
    where = "seq > ?" + (" AND session_id = ?" if session_id is not None else "")
    return db.rows(f"SELECT seq, session_id, body, rollout FROM {JOURNAL_TABLE} WHERE {where} "
                   f"ORDER BY seq LIMIT {int(limit)}",
                   (after,) if session_id is None else (after, session_id))


def expand(db: TraceDatabase, *, session_id: str | None = None,
           limit: int | None = None, until: float | None = None) -> int:
    """Build the rows of journaled sessions, oldest first (``session_id``: that one only),
    `CHUNK` a transaction, until none is left, ``limit`` were taken or the monotonic clock
    passes ``until``; how many were taken.

    A row that cannot be read back stays in the journal (and is logged); a session that
    cannot be stored (another with its id and other content is) is logged and dropped, as
    a direct write of it would have failed."""
    taken, after = 0, 0
    while (limit is None or taken < limit) and (until is None or time.monotonic() < until):
        size = CHUNK if limit is None else min(CHUNK, limit - taken)
        rows = entries(db, after=after, limit=size, session_id=session_id)
        if not rows:
            break
        after = rows[-1][0]
        taken += len(rows)
        built, sessions = [], []
        for seq, _, body, rollout in rows:
            try:
                sessions.append(decode_session(body, rollout))
            except Exception as exc:  # kept: nothing of ours writes such a row
                logger.error("%s: journal row %d cannot be read back (%s); it was left in "
                             "%s", db.display, seq, exc, JOURNAL_TABLE)
                continue
            built.append(seq)
        for session, outcome in zip(sessions, commit(db, sessions), strict=True):
            if outcome is not None:
                logger.warning("%s: journaled session %s was not stored: %s", db.display,
                               session.session_id, outcome)
        if built:
            db.run([(f"DELETE FROM {JOURNAL_TABLE} WHERE seq IN (SELECT value FROM "
                     "json_each(?))", (json.dumps(built),))])
    return taken


__all__ = ["CHUNK", "EXIT_BUILD_S", "IDLE_S", "any_waiting", "append", "entries", "expand",
           "waiting"]
