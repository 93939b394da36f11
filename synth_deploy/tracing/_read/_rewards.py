"""Rewards at a glance: distribution, reward over time per app and model, rubric scores,
error rate, and two models (or runs) compared seed by seed. All aggregated in SQL."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from synth_deploy.errors import UsageError
from synth_deploy.tracing._db._select import SessionFilter, SessionSql
from synth_deploy.tracing._store import TraceStore

MAX_BARS = 20
MAX_SERIES = 8
SAMPLE_ABOVE = 50_000
# A session is in the sample when a hash of its rowid says so: rowids follow arrival, and
# writers that take turns (model A, model B, A...) would alias with a plain rowid % k.
_HASH_MULTIPLIER, _HASH_PRIME = 2654435761, 4294967311
_UNIX_EPOCH_JULIAN_DAY = 2440587.5


@dataclass(frozen=True)
class RewardSummary:
    """What the glance panel shows for the sessions a filter selects.

    Counts, error rate, mean reward and ``histogram`` are exact: one bar per distinct reward
    when there are few, else `MAX_BARS` equal bins (``lo``/``hi``, ``count``). ``series``
    (mean reward per time bucket for each app · model, the largest `MAX_SERIES`) and
    ``event_scores`` (mean event reward per reward type) are read from one session in
    ``sampled_every`` (``events_sampled_every``) when the set is larger than `SAMPLE_ABOVE`
    (a fifth of it): 1 means all of them.
    """

    sessions: int = 0
    errors: int = 0
    scored: int = 0
    mean_reward: float | None = None
    first_at: str | None = None
    last_at: str | None = None
    histogram: list[dict[str, Any]] = field(default_factory=list)
    series: list[dict[str, Any]] = field(default_factory=list)
    series_total: int = 0
    event_scores: list[dict[str, Any]] = field(default_factory=list)
    sampled_every: int = 1
    events_sampled_every: int = 1

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.sessions if self.sessions else None

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "error_rate": self.error_rate}


def reward_summary(store: TraceStore, where: SessionFilter = SessionFilter(), *,
                   buckets: int = 40, sample_above: int = SAMPLE_ABOVE) -> RewardSummary:
    """Distribution, reward over time, event scores and error rate of ``where``'s sessions
    (by ``where.reward_version``'s reward when it names one)."""
    fields = SessionSql(store.database).judged_by(where.reward_version)
    q = fields.query
    clause, params, _ = fields.where(where)
    totals = _totals(fields, clause, params)
    if not totals["n"]:
        return RewardSummary()
    # Alone in their queries, MIN and MAX of an indexed column are one seek each.
    first = q(f"SELECT MIN(s.created_at) AS t FROM session_traces s{clause}", params)[0]["t"]
    last = q(f"SELECT MAX(s.created_at) AS t FROM session_traces s{clause}", params)[0]["t"]
    every = max(1, math.ceil(totals["n"] / sample_above))
    # Each session's event rewards cost a seek: they are averaged over a smaller sample.
    events_every = max(1, math.ceil(totals["n"] / (sample_above // 5)))
    return RewardSummary(
        sessions=int(totals["n"]), errors=int(totals["errors"] or 0),
        scored=int(totals["scored"] or 0), mean_reward=totals["mean"],
        first_at=first, last_at=last, sampled_every=every, events_sampled_every=events_every,
        histogram=_histogram(fields, clause, params, totals["lo"], totals["hi"]),
        **_series(fields, _sampled(clause, every), params, first, last, buckets),
        event_scores=_event_scores(fields, _sampled(clause, events_every), params))


def _sampled(clause: str, every: int) -> str:
    if every == 1:
        return clause
    return (f"{clause or ' WHERE 1'} AND "
            f"(s.rowid * {_HASH_MULTIPLIER}) % {_HASH_PRIME} % {every} = 0")


def _totals(fields: SessionSql, clause: str, params: list[Any]) -> dict[str, Any]:
    e, q = fields.expr, fields.query
    reward = e["reward"]
    if clause:  # one pass over the filter's index
        return q(f"SELECT COUNT(*) AS n, SUM({e['status']} = 'error') AS errors, "
                 f"COUNT({reward}) AS scored, AVG({reward}) AS mean, MIN({reward}) AS lo, "
                 f"MAX({reward}) AS hi FROM session_traces s{clause}", params)[0]
    # Everything: each figure from the index that holds it most cheaply (a count of the
    # smallest, rewards from the reward index, errors from the glance index, or a status
    # index before schema version 8) beats one pass decoding all.
    totals = q(f"SELECT COUNT({reward}) AS scored, AVG({reward}) AS mean "
               "FROM session_traces s")[0]
    for name, sql in (("n", "COUNT(*)"), ("lo", f"MIN({reward})"), ("hi", f"MAX({reward})")):
        totals[name] = q(f"SELECT {sql} AS v FROM session_traces s")[0]["v"]
    totals["errors"] = q(f"SELECT COUNT(*) AS v FROM session_traces s "
                         f"WHERE {e['status']} = 'error'")[0]["v"]
    return totals


def _histogram(fields: SessionSql, clause: str, params: list[Any], lo: Any, hi: Any
               ) -> list[dict[str, Any]]:
    if lo is None:
        return []
    # With a filter, walking the reward index for its order would read every row; the
    # filtered reward is read from the glance index and sorted.
    reward = fields.filtered_reward if clause else fields.expr["reward"]
    scored = f"{clause} AND {reward} IS NOT NULL" if clause else f" WHERE {reward} IS NOT NULL"
    distinct = fields.query(f"SELECT {reward} AS v, COUNT(*) AS n FROM session_traces s"
                            f"{scored} GROUP BY v ORDER BY v LIMIT {MAX_BARS + 1}", params)
    if len(distinct) <= MAX_BARS:
        return [{"lo": r["v"], "hi": r["v"], "count": r["n"]} for r in distinct]
    width = (float(hi) - float(lo)) / MAX_BARS
    rows = fields.query(
        f"SELECT MIN(CAST(({reward} - ?) / ? AS INTEGER), {MAX_BARS - 1}) AS b, "
        f"COUNT(*) AS n FROM session_traces s{scored} GROUP BY b ORDER BY b",
        [float(lo), width] + params)
    counts = {r["b"]: r["n"] for r in rows}
    return [{"lo": float(lo) + i * width, "hi": float(lo) + (i + 1) * width,
             "count": counts.get(i, 0)} for i in range(MAX_BARS)]


def _series(fields: SessionSql, clause: str, params: list[Any], first: str, last: str,
            buckets: int) -> dict[str, Any]:
    e = fields.expr
    span = fields.query("SELECT julianday(?) AS a, julianday(?) AS b", (first, last))[0]
    start, end = span["a"], span["b"]
    if start is None or end is None:
        return {"series": [], "series_total": 0}
    width = max((end - start) / buckets, 1e-9)
    rows = fields.query(
        f"SELECT {e['app']} AS app, {e['model']} AS model, "
        f"MIN(CAST((julianday(s.created_at) - ?) / ? AS INTEGER), {buckets - 1}) AS t, "
        f"COUNT(*) AS n, COUNT({e['reward']}) AS scored, AVG({e['reward']}) AS mean "
        f"FROM session_traces s{clause} "
        "GROUP BY app, model, t", [start, width] + params)
    groups: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["app"], r["model"]), []).append(r)
    ranked = sorted(groups.items(), key=lambda kv: -sum(r["n"] for r in kv[1]))
    series = []
    for (app, model), points in ranked[:MAX_SERIES]:
        series.append({
            "app": app, "model": model, "sessions": sum(r["n"] for r in points),
            "points": [{"at": _iso_of_julian(start + (r["t"] + 0.5) * width),
                        "sessions": r["n"], "scored": r["scored"], "mean_reward": r["mean"]}
                       for r in sorted(points, key=lambda r: r["t"])]})
    return {"series": series, "series_total": len(groups)}


def _iso_of_julian(day: float) -> str:
    seconds = (day - _UNIX_EPOCH_JULIAN_DAY) * 86400
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _event_scores(fields: SessionSql, clause: str, params: list[Any]) -> list[dict[str, Any]]:
    # CROSS JOIN keeps the (sampled) sessions as the outer loop: each one seeks its rewards,
    # instead of SQLite scanning every event reward and looking its session up. They are
    # picked by rowid (what the glance index holds), and only their rows read for the id.
    rows = fields.query(
        "SELECT er.reward_type AS reward_type, COUNT(*) AS n, AVG(er.reward_value) AS mean "
        f"FROM (SELECT s.rowid AS id FROM session_traces s{clause}) AS picked "
        "CROSS JOIN session_traces t ON t.rowid = picked.id "
        "CROSS JOIN event_rewards er ON er.session_id = t.session_id "
        "GROUP BY er.reward_type ORDER BY n DESC LIMIT 50", params)
    return [{"reward_type": r["reward_type"] or "", "events": r["n"], "mean": r["mean"]}
            for r in rows]


@dataclass(frozen=True)
class Comparison:
    """Two models (or runs) seed by seed: each side's mean reward and the difference B − A."""

    by: str
    a: str
    b: str
    seeds: list[dict[str, Any]]
    shared_seeds: int
    mean_a: float | None
    mean_b: float | None
    mean_difference: float | None
    b_better: int
    a_better: int
    ties: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def compare_by_seed(store: TraceStore, a: str, b: str, *, by: Literal["model", "run"] = "model",
                    where: SessionFilter = SessionFilter(), max_seeds: int = 5000
                    ) -> Comparison:
    """Per seed, the mean reward of sessions with model (or run) ``a`` and ``b`` among those
    ``where`` selects; the summary counts only seeds both sides played."""
    if by not in ("model", "run"):
        raise UsageError(f"cannot compare by {by!r}", hint="compare by model or run")
    if not a or not b:
        raise UsageError("choose two sides to compare", hint=f"give both {by}s")
    where = dataclasses.replace(where, **{"model" if by == "model" else "run_id": None})
    fields = SessionSql(store.database).judged_by(where.reward_version)
    e = fields.expr
    key, reward = e[by], e["reward"]
    clause, params, _ = fields.where(where, extra=[f"{key} IN (?, ?)", f"{e['seed']} IS NOT NULL"],
                                     params=[a, b])
    rows = fields.query(
        f"SELECT {e['seed']} AS seed, "
        f"AVG(CASE WHEN {key} = ? THEN {reward} END) AS mean_a, SUM({key} = ?) AS n_a, "
        f"AVG(CASE WHEN {key} = ? THEN {reward} END) AS mean_b, SUM({key} = ?) AS n_b "
        f"FROM session_traces s{clause} GROUP BY seed ORDER BY seed LIMIT ?",
        [a, a, b, b] + params + [max_seeds])
    seeds, diffs = [], []
    for r in rows:
        both = r["mean_a"] is not None and r["mean_b"] is not None
        diff = r["mean_b"] - r["mean_a"] if both else None
        seeds.append({"seed": r["seed"], "a": r["mean_a"], "a_sessions": r["n_a"],
                      "b": r["mean_b"], "b_sessions": r["n_b"], "difference": diff})
        if both:
            diffs.append((r["mean_a"], r["mean_b"], diff))

    def mean(values: list[float]) -> float | None:
        return sum(values) / len(values) if values else None

    return Comparison(
        by=by, a=a, b=b, seeds=seeds, shared_seeds=len(diffs),
        mean_a=mean([d[0] for d in diffs]), mean_b=mean([d[1] for d in diffs]),
        mean_difference=mean([d[2] for d in diffs]),
        b_better=sum(d[2] > 0 for d in diffs), a_better=sum(d[2] < 0 for d in diffs),
        ties=sum(d[2] == 0 for d in diffs))


__all__ = ["Comparison", "RewardSummary", "compare_by_seed", "reward_summary"]
