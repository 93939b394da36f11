"""`RolloutRecords`: asynchronous rollouts' records, shared in the trace store.

A rollout submitted asynchronously (synth-containers' ``submission_mode: "async"``) is
answered by id long after its submission, perhaps to another client, perhaps by another
server on the same store (replicas on one libSQL store, two apps on one SQLite file), perhaps
after the server restarted. Its record lives beside its trace, in a table of its own
(``async_rollouts``, keyed by app and rollout id; the session tables are not touched), and
each server that runs rollouts keeps a heartbeat in ``rollout_runners``:

    records = RolloutRecords(store)
    records.apply("math", "owner-1", [RolloutClaim("r-1", digest, "owner-1", now)], [], now)
    records.get("math", "r-1")               # a RolloutRecord, or None

What makes it shared (the same operations the Modal Dict's records offer, see
`synth_deploy.modal`):

- **an atomic claim**: each claim carries a token of its own and is an ``INSERT ... ON
  CONFLICT DO NOTHING``; the token read back says whether this claim wrote the row. Two
  servers claiming one id at once: exactly one runs it.
- **the runner's liveness**: ``owner`` names the server process that runs a rollout; while
  it runs any, it beats every `TICK_S`. A record still ``running`` under an owner not heard
  from for `RUNNER_LOST_S` was lost with that process (`RolloutRecord.lost`).
- **asks that reach the runner**: a read on another server renews the lease (``touch``),
  a terminate there asks for the stop (``request_stop``); the runner reads both at its tick.
- **bounded**: finished records older than `RECORD_KEPT_S`, and those past the newest
  `RECORD_KEPT` of an app, are deleted (`prune`, run by the runners now and then).
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
RUNNERS = "rollout_runners"
RUNNING = "running"
# A runner beats this often while it runs rollouts; one silent this long is gone.
TICK_S = 1.0
RUNNER_LOST_S = 10.0
# Finished records kept: 7 days (as a Modal Dict keeps an idle entry), the newest 100,000.
RECORD_KEPT_S = 7 * 86_400.0
RECORD_KEPT = 100_000


@dataclass(frozen=True)
class RolloutRecord:
    """One asynchronous rollout as stored: ``result`` is its answer once it has one;
    ``touched_at``/``ttl_s``: when a client last asked after it, and its lease;
    ``stop``: a stop asked for on another server; ``runner_seen``: its owner's last beat
    (epoch seconds; None when it never beat)."""

    rollout_id: str
    digest: str  # of the request that started it: another request under its id is refused
    status: str
    owner: str
    created_at: str  # ISO 8601 with its zone, as every time is given (`zoned`)
    updated_at: str
    result: dict[str, Any] | None = None
    touched_at: float | None = None
    ttl_s: float | None = None
    stop: str | None = None
    runner_seen: float | None = None

    def lost(self, owner: str, now: float) -> bool:
        """True when the record says running but no longer can: its runner is not
        ``owner`` (the process asking) and has not been heard from for `RUNNER_LOST_S`."""
        return (self.status == RUNNING and self.owner != owner and
                (self.runner_seen is None or now - self.runner_seen > RUNNER_LOST_S))


class RolloutClaim(NamedTuple):
    """A rollout starting under ``owner`` (``at``: epoch seconds; ``ttl_s``: its lease)."""

    rollout_id: str
    digest: str
    owner: str
    at: float
    ttl_s: float = 300.0


class RolloutFinish(NamedTuple):
    """A rollout's end: its status and answer (``at``: epoch seconds)."""

    rollout_id: str
    status: str
    result: dict[str, Any]
    at: float


class RunnerNews(NamedTuple):
    """What other servers asked of a runner's rollouts: stops (id → reason) and the
    latest touch of those it asked about (id → epoch seconds, lease seconds: None keeps
    the lease it has)."""

    stops: dict[str, str]
    touched: dict[str, tuple[float, float | None]]


_CLAIM = (f"INSERT INTO {TABLE} (app_id, rollout_id, digest, status, owner, created_at, "
          "updated_at, claim, touched_at, ttl_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
          "ON CONFLICT (app_id, rollout_id) DO NOTHING")
_BEAT = (f"INSERT INTO {RUNNERS} (owner, seen_at) VALUES (?, ?) "
         "ON CONFLICT (owner) DO UPDATE SET seen_at = excluded.seen_at")
_SELECT = (f"SELECT r.*, w.seen_at AS runner_seen FROM {TABLE} r LEFT JOIN {RUNNERS} w "
           "ON w.owner = r.owner WHERE r.app_id = ?")


class RolloutRecords:
    """The shared records of ``store`` (its tables made by the schema, version 12).
    Blocking calls: a server runs them off its event loop."""

    def __init__(self, store: TraceStore) -> None:
        self.database = store.database
        self._claims = 0
        self.kept, self.kept_s = RECORD_KEPT, RECORD_KEPT_S

    def apply(self, app_id: str, owner: str, claims: Sequence[RolloutClaim],
              finishes: Sequence[RolloutFinish], now: float) -> dict[str, RolloutRecord]:
        """Many claims and finishes of ``owner`` in one transaction (what a busy server
        batches), its heartbeat with them; returns the record already there for each of
        ``claims`` another claim holds (those absent were claimed here)."""
        tokens = {c.rollout_id: f"{owner}:{self._claims + i}" for i, c in enumerate(claims)}
        self._claims += len(claims)
        statements: list[tuple[str, Sequence[Any]]] = [(_BEAT, (owner, now))]
        statements += [(_CLAIM, (app_id, c.rollout_id, c.digest, RUNNING, c.owner, iso(c.at),
                                 iso(c.at), tokens[c.rollout_id], c.at, c.ttl_s))
                       for c in claims]
        statements += [(f"UPDATE {TABLE} SET status = ?, result = ?, updated_at = ?, "
                        "stop = NULL WHERE app_id = ? AND rollout_id = ?",
                        (f.status, json.dumps(f.result), iso(f.at), app_id, f.rollout_id))
                       for f in finishes]
        self.database.run(statements)
        if not claims:
            return {}
        rows = self.database.query(
            _SELECT + " AND r.rollout_id IN (SELECT value FROM json_each(?))",
            (app_id, json.dumps(list(tokens))))
        # The claim whose token the row holds is the one that wrote it.
        return {row["rollout_id"]: _record(row) for row in rows
                if row["claim"] != tokens[row["rollout_id"]]}

    def get(self, app_id: str, rollout_id: str) -> RolloutRecord | None:
        rows = self.database.query(_SELECT + " AND r.rollout_id = ?", (app_id, rollout_id))
        return _record(rows[0]) if rows else None

    def touch(self, app_id: str, rollout_id: str, now: float, ttl_s: float | None = None
              ) -> None:
        """A client asked after ``rollout_id`` here: its runner holds its lease from ``now``
        (for ``ttl_s`` from now on, when given)."""
        self.database.run([(f"UPDATE {TABLE} SET touched_at = max(coalesce(touched_at, 0), ?), "
                            "ttl_s = coalesce(?, ttl_s) WHERE app_id = ? AND rollout_id = ? "
                            "AND status = ?", (now, ttl_s, app_id, rollout_id, RUNNING))])

    def request_stop(self, app_id: str, rollout_id: str, reason: str) -> None:
        """Ask ``rollout_id``'s runner to stop it for ``reason`` (at its next tick)."""
        self.database.run([(f"UPDATE {TABLE} SET stop = ? WHERE app_id = ? AND "
                            "rollout_id = ? AND status = ?",
                            (reason, app_id, rollout_id, RUNNING))])

    def news(self, app_id: str, owner: str, asked: Sequence[str], now: float) -> RunnerNews:
        """``owner``'s tick: its heartbeat written, and what was asked of its rollouts:
        the stops, and the touches of ``asked`` (those whose lease runs out here)."""
        self.database.run([(_BEAT, (owner, now))])
        stops = {row["rollout_id"]: row["stop"] for row in self.database.query(
            f"SELECT rollout_id, stop FROM {TABLE} WHERE owner = ? AND status = ? AND "
            "app_id = ? AND stop IS NOT NULL", (owner, RUNNING, app_id))}
        touched = {}
        if asked:
            touched = {row["rollout_id"]: (row["touched_at"], row["ttl_s"]) for row in
                       self.database.query(
                           f"SELECT rollout_id, touched_at, ttl_s FROM {TABLE} WHERE app_id = "
                           "? AND rollout_id IN (SELECT value FROM json_each(?)) AND "
                           "touched_at IS NOT NULL", (app_id, json.dumps(list(asked))))}
        return RunnerNews(stops, touched)

    def retire(self, owner: str) -> None:
        """``owner`` stops: its running rollouts are lost from now on, not `RUNNER_LOST_S`
        later."""
        self.database.run([(f"UPDATE {RUNNERS} SET seen_at = 0 WHERE owner = ?", (owner,))])

    def prune(self, app_id: str, now: float) -> None:
        """Delete finished records past `RECORD_KEPT_S` or the newest `RECORD_KEPT`, running
        ones whose runner has been gone as long, and runners silent as long."""
        old = iso(now - self.kept_s)
        self.database.run([
            (f"DELETE FROM {TABLE} WHERE app_id = ? AND updated_at < ? AND (status != ? OR "
             f"coalesce((SELECT seen_at FROM {RUNNERS} w WHERE w.owner = "
             f"{TABLE}.owner), 0) < ?)", (app_id, old, RUNNING, now - self.kept_s)),
            (f"DELETE FROM {TABLE} WHERE app_id = ? AND status != ? AND rowid IN (SELECT "
             f"rowid FROM {TABLE} WHERE app_id = ? AND status != ? ORDER BY updated_at DESC "
             "LIMIT -1 OFFSET ?)", (app_id, RUNNING, app_id, RUNNING, self.kept)),
            (f"DELETE FROM {RUNNERS} WHERE seen_at < ?", (now - self.kept_s,)),
        ])


def _record(row: dict[str, Any]) -> RolloutRecord:
    result = json.loads(row["result"]) if row["result"] else None
    return RolloutRecord(row["rollout_id"], row["digest"], row["status"], row["owner"],
                         str(zoned(row["created_at"])), str(zoned(row["updated_at"])), result,
                         row.get("touched_at"), row.get("ttl_s"), row.get("stop"),
                         row.get("runner_seen"))


__all__ = ["RECORD_KEPT", "RECORD_KEPT_S", "RUNNER_LOST_S", "TICK_S", "RolloutClaim",
           "RolloutFinish", "RolloutRecord", "RolloutRecords", "RunnerNews"]
