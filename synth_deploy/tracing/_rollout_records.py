"""`RolloutRecords`: asynchronous rollouts' state and results, kept in the trace store.

A rollout submitted asynchronously (synth-containers' ``submission_mode: "async"``) is
answered by id long after its submission, perhaps to another client, perhaps after the
server restarted. Its record lives beside its trace, in a table of its own
(``async_rollouts``, made when first used; the session tables are not touched):

    records = RolloutRecords(store)
    records.claim("r-1", digest, owner)      # None: new; else the record already there
    records.finish("r-1", "completed", result)
    records.get("r-1")                       # a RolloutRecord, or None

``owner`` names the server process that runs a rollout: a record still ``running`` under
another owner was lost with that process (see `RolloutRecord.lost_by`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from synth_deploy.tracing._times import iso, zoned

if TYPE_CHECKING:
    from synth_deploy.tracing._store import TraceStore

TABLE = "async_rollouts"
_CREATE = (f"CREATE TABLE IF NOT EXISTS {TABLE} (rollout_id TEXT PRIMARY KEY, "
           "digest TEXT NOT NULL, status TEXT NOT NULL, owner TEXT NOT NULL, "
           "created_at TEXT NOT NULL, updated_at TEXT NOT NULL, result TEXT)")
RUNNING = "running"


@dataclass(frozen=True)
class RolloutRecord:
    """One asynchronous rollout as stored: ``result`` is its answer once it has one."""

    rollout_id: str
    digest: str  # of the request that started it: another request under its id is refused
    status: str
    owner: str
    created_at: str  # ISO 8601 with its zone, as every time is given (`zoned`)
    updated_at: str
    result: dict[str, Any] | None = None

    def lost_by(self, owner: str) -> bool:
        """True when the record says running but no longer can: ``owner`` (the process
        asking) is not the one that ran it, so that process stopped before it finished."""
        return self.status == RUNNING and self.owner != owner


class RolloutClaim(NamedTuple):
    """A rollout starting under ``owner`` (``at``: epoch seconds)."""

    rollout_id: str
    digest: str
    owner: str
    at: float


class RolloutFinish(NamedTuple):
    """A rollout's end: its status and answer (``at``: epoch seconds)."""

    rollout_id: str
    status: str
    result: dict[str, Any]
    at: float


class RolloutRecords:
    """The ``async_rollouts`` table of ``store`` (made when first used). Blocking calls: a
    server runs them off its event loop."""

    def __init__(self, store: TraceStore) -> None:
        self.database = store.database
        self._made = False

    def _table(self) -> None:
        if not self._made:
            self.database.run([(_CREATE, ())])
            self._made = True

    def claim(self, rollout_id: str, digest: str, owner: str, now: float) -> RolloutRecord | None:
        """Record ``rollout_id`` as running under ``owner``, unless it is recorded already:
        then the record that is there (and nothing is written)."""
        return self.apply([RolloutClaim(rollout_id, digest, owner, now)], []).get(rollout_id)

    def finish(self, rollout_id: str, status: str, result: dict[str, Any], now: float) -> None:
        """Store ``rollout_id``'s final ``status`` and answer."""
        self.apply([], [RolloutFinish(rollout_id, status, result, now)])

    def apply(self, claims: Sequence[RolloutClaim], finishes: Sequence[RolloutFinish]
              ) -> dict[str, RolloutRecord]:
        """Many claims and finishes in one transaction (what a busy server batches); returns
        the records already there for those of ``claims`` that were not written. The
        server that calls it keeps the rollouts it runs in hand, so two claims of one id
        never race in it."""
        self._table()
        found: dict[str, RolloutRecord] = {}
        if claims:
            rows = self.database.query(
                f"SELECT * FROM {TABLE} WHERE rollout_id IN (SELECT value FROM json_each(?))",
                (json.dumps([c.rollout_id for c in claims]),))
            found = {row["rollout_id"]: _record(row) for row in rows}
        statements: list[tuple[str, Sequence[Any]]] = [
            (f"INSERT OR IGNORE INTO {TABLE} (rollout_id, digest, status, owner, created_at, "
             "updated_at) VALUES (?, ?, ?, ?, ?, ?)",
             (c.rollout_id, c.digest, RUNNING, c.owner, iso(c.at), iso(c.at)))
            for c in claims if c.rollout_id not in found]
        statements += [(f"UPDATE {TABLE} SET status = ?, result = ?, updated_at = ? "
                        "WHERE rollout_id = ?",
                        (f.status, json.dumps(f.result), iso(f.at), f.rollout_id))
                       for f in finishes]
        if statements:
            self.database.run(statements)
        return found

    def get(self, rollout_id: str) -> RolloutRecord | None:
        self._table()
        rows = self.database.query(f"SELECT * FROM {TABLE} WHERE rollout_id = ?", (rollout_id,))
        return _record(rows[0]) if rows else None


def _record(row: dict[str, Any]) -> RolloutRecord:
    result = json.loads(row["result"]) if row["result"] else None
    return RolloutRecord(row["rollout_id"], row["digest"], row["status"], row["owner"],
                         str(zoned(row["created_at"])), str(zoned(row["updated_at"])), result)


__all__ = ["RolloutClaim", "RolloutFinish", "RolloutRecord", "RolloutRecords"]
