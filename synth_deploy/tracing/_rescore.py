"""Rewards given again from what was stored: a scorer run over stored sessions, each result
kept as a new reward version beside the original (`traces rescore`).

The sessions are those a `SessionFilter` selects (the rule every reader shares), failed
rollouts left out: their episodes did not finish. Each is read back whole (`SessionTrace`)
and handed to the scorer; what it returns is written to the version's row for that session
(table `reward_versions`, schema v12), never over the session's recorded reward or outcome
rows, so every earlier reading stays as it was. Rescoring again with the same version label
replaces that version's rows. A session the scorer cannot score (it raised, or returned no
finite number) keeps no row in the version, and the result says which and why.

Readers choose a version with `SessionFilter(reward_version=...)`: the exports, `traces
show`, the viewer.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from synth_deploy.errors import UsageError
from synth_deploy.tracing._db._schema import REWARD_VERSIONS_TABLE
from synth_deploy.tracing._db._select import VERSION_LABEL, SessionFilter, SessionSql
from synth_deploy.tracing._session import SessionTrace
from synth_deploy.tracing._store import TraceStore
from synth_deploy.tracing._times import iso

PAGE_SESSIONS = 200
MAX_LISTED = 50  # unscored sessions named one by one; the rest are counted by reason
ORIGINAL_REWARD = "original"  # the recorded reward, as readers name it beside versions
Score = Callable[[SessionTrace], Any]


@dataclass(frozen=True)
class Unscored:
    """A session the scorer gave no reward, and why."""

    session_id: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"session_id": self.session_id, "reason": self.reason}


@dataclass(frozen=True)
class RescoreResult:
    """What a rescore did: ``rescored`` of the ``matched`` sessions got a reward in
    ``version`` (``replaced``: they had one there already), ``changed`` of them one other
    than the recorded reward; the means are over the rescored sessions (before: their
    recorded reward, where they had one). ``unscored`` names up to `MAX_LISTED` of the
    ``unscored_count`` sessions left without one; ``unscored_reasons`` counts them all by
    the kind of reason. ``failed_left_out``: failed rollouts the filter matched, never
    rescored."""

    version: str
    scorer: dict[str, Any]
    matched: int
    rescored: int
    changed: int
    replaced: int
    mean_before: float | None
    mean_after: float | None
    unscored_count: int
    unscored: list[Unscored] = field(default_factory=list)
    unscored_reasons: dict[str, int] = field(default_factory=dict)
    failed_left_out: int = 0
    seconds: float = 0.0

    @property
    def unchanged(self) -> int:
        return self.rescored - self.changed

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "unchanged": self.unchanged,
                "unscored": [u.to_dict() for u in self.unscored]}


def rescore_sessions(store: TraceStore, where: SessionFilter, score: Score, *, version: str,
                     scorer: Mapping[str, Any],
                     progress: Callable[[int, int], None] | None = None) -> RescoreResult:
    """Give every session ``where`` selects (failed rollouts left out) the reward ``score``
    returns for it, as reward version ``version``; ``scorer`` says which scorer that is
    (stored with each row: the app, its code, the function)."""
    started = time.perf_counter()
    _check_rescore(store, where, version)
    db = store.database
    sql = SessionSql(db)
    ok_where = dataclasses.replace(where, status="ok")
    clause, params, _ = sql.where(ok_where)
    matched = _count(db, clause, params) if where.status != "error" else 0
    failed_clause, failed_params, _ = sql.where(dataclasses.replace(where, status="error"))
    failed = _count(db, failed_clause, failed_params) if where.status != "ok" else 0
    tally = _Tally(score, version, json.dumps(dict(scorer), sort_keys=True))
    recorded = sql.reward(None)
    done = 0
    after_key: list[Any] = []
    while matched:
        rows = _session_page(db, clause, params, after_key, recorded)
        if not rows:
            break
        after_key = [rows[-1][2], rows[-1][3]]
        db.run(tally.page_writes(db, rows))  # a page at a time, each in one transaction
        done += len(rows)
        if progress is not None:
            progress(done, matched)
    return RescoreResult(
        version=version, scorer=dict(scorer), matched=matched, rescored=tally.rescored,
        changed=tally.changed, replaced=tally.replaced, mean_before=_mean(tally.before),
        mean_after=_mean(tally.after), unscored_count=sum(tally.reasons.values()),
        unscored=tally.unscored, unscored_reasons=dict(tally.reasons), failed_left_out=failed,
        seconds=time.perf_counter() - started)


def _check_rescore(store: TraceStore, where: SessionFilter, version: str) -> None:
    """`UsageError` for a label that cannot name a version, a filter by reward version, or
    a store opened read-only."""
    if version == ORIGINAL_REWARD or not VERSION_LABEL.fullmatch(version):
        raise UsageError(f"{version[:40]!r} cannot name a reward version",
                         hint="letters, digits, '.', '_', '+', '-' (up to 64), not "
                              f"{ORIGINAL_REWARD!r}: that is the recorded reward")
    if where.reward_version is not None:
        raise UsageError("a rescore selects sessions by what they recorded, not by a reward "
                         "version", hint="leave --reward-version out")
    if store.read_only:
        raise UsageError(f"{store.display} was opened read-only: a rescore writes versions")


def _count(db: Any, selected: str, values: list[Any]) -> int:
    """How many sessions a WHERE clause selects."""
    return int(db.query(f"SELECT COUNT(*) AS n FROM session_traces s{selected}",
                        values)[0]["n"])


def _session_page(db: Any, clause: str, params: list[Any], after_key: list[Any],
                  recorded: str) -> list[tuple[Any, ...]]:
    """The next page of selected sessions, oldest first, as (session id, recorded reward,
    created_at, rowid), after ``after_key`` (created_at, rowid) when given."""
    keyset = "(s.created_at, s.rowid) > (?, ?)" if after_key else ""
    page_where = clause + (" AND " if clause and keyset else " WHERE " if keyset
                           else "") + keyset
    return db.rows(f"SELECT s.session_id, {recorded}, s.created_at, s.rowid FROM "
                   f"session_traces s{page_where} ORDER BY s.created_at, s.rowid "
                   f"LIMIT {PAGE_SESSIONS}", params + after_key)


@dataclass
class _Tally:
    """A rescore's running counts, and the writes each page of sessions makes."""

    score: Score
    version: str
    said: str  # the scorer, as JSON stored with each row
    rescored: int = 0
    changed: int = 0
    replaced: int = 0
    before: list[float] = field(default_factory=list)
    after: list[float] = field(default_factory=list)
    unscored: list[Unscored] = field(default_factory=list)
    reasons: Counter[str] = field(default_factory=Counter)

    def page_writes(self, db: Any, rows: list[tuple[Any, ...]]
                    ) -> list[tuple[str, tuple[Any, ...]]]:
        """Each session of the page scored: its version's row written, or (no reward)
        removed."""
        version = self.version
        held = {r[0] for r in db.rows(
            f"SELECT session_id FROM {REWARD_VERSIONS_TABLE} WHERE version = ? AND "
            "session_id IN (SELECT value FROM json_each(?))",
            (version, json.dumps([r[0] for r in rows])))}
        now = iso(time.time())
        writes: list[tuple[str, tuple[Any, ...]]] = []
        for session_id, old, _, _ in rows:
            reward, why = _scored(self.score, db.session(session_id))
            if why is not None:
                self._unscored(session_id, why)
                # A version that no longer scores a session keeps no reward for it.
                writes.append((f"DELETE FROM {REWARD_VERSIONS_TABLE} WHERE session_id = ? "
                               "AND version = ?", (session_id, version)))
                continue
            writes.append((f"INSERT OR REPLACE INTO {REWARD_VERSIONS_TABLE} (session_id, "
                           "version, reward, scorer, created_at) VALUES (?, ?, ?, ?, ?)",
                           (session_id, version, reward, self.said, now)))
            self._rescored(reward, old, session_id in held)
        return writes

    def _unscored(self, session_id: str, why: str) -> None:
        """A session left without a reward: named (up to `MAX_LISTED`), counted by reason."""
        if len(self.unscored) < MAX_LISTED:
            self.unscored.append(Unscored(session_id, why))
        self.reasons[why.split(":", 1)[0]] += 1

    def _rescored(self, reward: float, old: Any, held: bool) -> None:
        """A session given ``reward`` (``old``: its recorded one; ``held``: it had one in
        this version already)."""
        self.rescored += 1
        self.replaced += held
        self.changed += old is None or float(old) != reward
        self.after.append(reward)
        if old is not None:
            self.before.append(float(old))


def _scored(score: Score, session: SessionTrace | None) -> tuple[float, None] | tuple[None, str]:
    """(the reward, None), or (None, why there is none)."""
    if session is None:  # removed while the rescore ran
        return None, "gone: the session is no longer stored"
    try:
        value = score(session)
    except Exception as exc:  # the scorer's failure on one session is that session's
        return None, f"raised: {type(exc).__name__}: {str(exc)[:200]}"
    if value is None:
        return None, "no reward: the scorer returned None"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None, f"not a number: the scorer returned {type(value).__name__}"
    if not math.isfinite(value):
        return None, f"not finite: the scorer returned {value}"
    return float(value), None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def reward_versions_of(store: TraceStore, session_id: str) -> list[dict[str, Any]]:
    """Every reward version of one session: version, reward, scorer, created_at (oldest
    first); none in a store whose schema predates them."""
    db = store.database
    if not SessionSql(db).has_reward_versions:
        return []
    return [{"version": r["version"], "reward": r["reward"], "created_at": str(r["created_at"]),
             "scorer": json.loads(r["scorer"])} for r in db.query(
        f"SELECT version, reward, scorer, created_at FROM {REWARD_VERSIONS_TABLE} WHERE "
        "session_id = ? ORDER BY created_at, version", (session_id,))]


def reward_versions(store: TraceStore) -> list[dict[str, Any]]:
    """The reward versions in the store: each label with its sessions, mean reward, the
    scorer that wrote it last and when (newest first)."""
    db = store.database
    if not SessionSql(db).has_reward_versions:
        return []
    rows = db.query(f"SELECT version, COUNT(*) AS n, AVG(reward) AS mean, MAX(created_at) "
                    f"AS last_at FROM {REWARD_VERSIONS_TABLE} GROUP BY version "
                    "ORDER BY last_at DESC, version")
    out = []
    for r in rows:
        scorer = db.query(f"SELECT scorer FROM {REWARD_VERSIONS_TABLE} WHERE version = ? "
                          "ORDER BY created_at DESC LIMIT 1", (r["version"],))[0]["scorer"]
        out.append({"version": r["version"], "sessions": int(r["n"]), "mean_reward": r["mean"],
                    "last_at": str(r["last_at"]), "scorer": json.loads(scorer)})
    return out


__all__ = ["MAX_LISTED", "ORIGINAL_REWARD", "RescoreResult", "Unscored", "rescore_sessions",
           "reward_versions", "reward_versions_of"]
