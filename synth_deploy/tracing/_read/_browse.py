"""Browsing a trace store: filtered pages of sessions, and the values its filters offer.

What `synth-deploy traces view` shows. Paging, filtering (`SessionFilter`, one rule for all
readers: see `_db._select`), sorting and aggregation happen in SQL, so a page of a
million-session store costs an indexed query, never a full read. Reads only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from synth_deploy.errors import UsageError
from synth_deploy.tracing._db import _totals as totals
from synth_deploy.tracing._db._select import FIELDS, SessionFilter, SessionSql
from synth_deploy.tracing._store import TraceStore
from synth_deploy.tracing._times import zoned

COUNT_CAP = 100_000
SAMPLE_FOR_CHOICES = 20_000


# Sort keys the table offers (rowid breaks ties, and every index holds it). A page's sessions
# are picked by their rowids first, from what an index holds, and only those rows are read:
# a sort the glance index holds but does not lead with (app, model) reads that index once
# and keeps the best page, where picking from the rows would read all of them.
_SORTS = {"created": ("created",), "reward": ("reward",), "app": ("app", "created"),
          "model": ("model", "created"), "run": ("run",)}
SORT_KEYS = tuple(_SORTS)


@dataclass(frozen=True)
class SessionRow:
    """One session as the viewer's table lists it."""

    session_id: str
    created_at: str
    app_id: str | None
    run_id: str | None
    model: str | None
    seed: int | None
    status: str | None
    total_reward: float | None
    mode: str | None
    split: str | None
    duration_s: float | None
    error: str | None
    num_timesteps: int
    num_events: int
    num_messages: int
    app_version: str | None = None
    app_digest: str | None = None
    reward_version: str | None = None  # whose reward ``total_reward`` is (None: recorded)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class SessionPage:
    """A page of sessions; ``total`` is exact unless ``total_is_lower_bound``."""

    rows: list[SessionRow]
    offset: int
    limit: int
    total: int
    total_is_lower_bound: bool

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [r.to_dict() for r in self.rows], "offset": self.offset,
                "limit": self.limit, "total": self.total,
                "total_is_lower_bound": self.total_is_lower_bound}


def browse_sessions(store: TraceStore, where: SessionFilter = SessionFilter(), *,
                    sort: str = "created", descending: bool = True, offset: int = 0,
                    limit: int = 50, count_cap: int = COUNT_CAP) -> SessionPage:
    """One page of the sessions ``where`` selects, sorted by ``sort`` (one of `SORT_KEYS`).

    The total is exact when every filter is on an indexed column; otherwise counting stops
    at ``count_cap`` (``total_is_lower_bound``) so a rare match cannot cost a full scan twice.
    """
    if sort not in SORT_KEYS:
        raise UsageError(f"cannot sort by {sort!r}", hint=f"sort by one of {', '.join(SORT_KEYS)}")
    if limit < 1 or offset < 0:
        raise UsageError(f"bad page: offset {offset}, limit {limit}",
                         hint="offset ≥ 0 and limit ≥ 1")
    # The reward shown and sorted by: the recorded one, or the chosen version's.
    fields = SessionSql(store.database).judged_by(where.reward_version)
    e = fields.expr
    clause, params, indexed = fields.where(where)
    order = "DESC" if descending else "ASC"
    order_by = f"{', '.join(f'{e[name]} {order}' for name in _SORTS[sort])}, s.rowid {order}"
    rows = fields.query(
        f"SELECT s.session_id, s.created_at, {e['app']} AS app, {e['run']} AS run, "
        f"{e['model']} AS model, {e['seed']} AS seed, {e['status']} AS status, "
        f"{e['reward']} AS reward, {e['mode']} AS mode, {e['split']} AS split, "
        f"{e['duration_s']} AS duration_s, {e['error']} AS error, s.num_timesteps, "
        f"s.num_events, s.num_messages, {e['app_version']} AS app_version, "
        f"{e['app_digest']} AS app_digest FROM session_traces s WHERE s.rowid IN "
        f"(SELECT s.rowid FROM session_traces s{clause} ORDER BY {order_by} LIMIT ? OFFSET ?) "
        f"ORDER BY {order_by}",
        params + [int(limit), int(offset)])
    if indexed:
        total = fields.query(f"SELECT COUNT(*) AS n FROM session_traces s{clause}",
                             params)[0]["n"]
        capped = False
    else:
        total = fields.query(f"SELECT COUNT(*) AS n FROM (SELECT 1 FROM session_traces s"
                             f"{clause} LIMIT ?)", params + [count_cap + 1])[0]["n"]
        capped = total > count_cap
        total = min(total, count_cap)
    return SessionPage(rows=[_row(r, where.reward_version) for r in rows], offset=offset,
                       limit=limit,
                       total=int(total), total_is_lower_bound=capped)


def _row(r: dict[str, Any], reward_version: str | None = None) -> SessionRow:
    seed = r["seed"]
    return SessionRow(
        session_id=r["session_id"], created_at=str(zoned(r["created_at"])), app_id=r["app"],
        run_id=r["run"], model=r["model"], seed=int(seed) if isinstance(seed, int | float)
        else None, status=r["status"], total_reward=_float(r["reward"]), mode=r["mode"],
        split=r["split"], duration_s=_float(r["duration_s"]),
        error=None if r["error"] is None else str(r["error"]),
        num_timesteps=r["num_timesteps"], num_events=r["num_events"],
        num_messages=r["num_messages"], app_version=_str(r["app_version"]),
        app_digest=_str(r["app_digest"]), reward_version=reward_version)


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def matching_session_ids(store: TraceStore, where: SessionFilter, *,
                         oldest_first: bool = True) -> list[str]:
    """The ids of every session ``where`` selects, in creation order."""
    fields = SessionSql(store.database)
    clause, params, _ = fields.where(where)
    order = "ASC" if oldest_first else "DESC"
    return [r["session_id"] for r in fields.query(
        f"SELECT s.session_id FROM session_traces s{clause} "
        f"ORDER BY s.created_at {order}, s.rowid {order}", params)]


def filter_choices(store: TraceStore, *, sample: int = SAMPLE_FOR_CHOICES) -> dict[str, Any]:
    """Values to offer in the filters: every app, model, run, mode and split.

    From the running totals, which group sessions by all but the run (schema version 8); by
    one index seek a value where a field has an index of its own (the run; each filter
    before version 8); on a file without those indexes, the values seen in the newest
    ``sample``.
    """
    fields = SessionSql(store.database)
    choices: dict[str, Any] = {}
    for name in ("app", "model", "run", "mode", "split"):
        column = FIELDS[name]
        if store.schema_version >= totals.CHOICES_VERSION and column in totals.SESSION_KEYS:
            choices[name] = [str(r[0]) for r in fields.rows(totals.choices(column))]
        elif name in fields.indexed:
            choices[name] = _distinct_by_index(fields, fields.expr[name])
        else:
            choices[name] = _distinct_in_sample(fields, fields.expr[name], sample)
    # Apart, MIN and MAX are one index seek each (together they would scan).
    one = lambda sql: fields.query(f"SELECT {sql} AS v FROM session_traces")[0]["v"]  # noqa: E731
    choices.update(sessions=int(one("COUNT(*)")), first_at=zoned(one("MIN(created_at)")),
                   last_at=zoned(one("MAX(created_at)")))
    return choices


@dataclass(frozen=True)
class IdentityGroup:
    """The sessions one code of one app made (`AppIdentity`: its version and digest)."""

    app_id: str | None
    app_version: str | None
    app_digest: str | None
    sessions: int
    errors: int
    mean_reward: float | None
    first_at: str | None
    last_at: str | None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def identity_groups(store: TraceStore, where: SessionFilter = SessionFilter(), *,
                    limit: int = 100) -> list[IdentityGroup]:
    """The sessions ``where`` selects, grouped by app and by the code that made them
    (newest code first); sessions stored before identities were recorded, or by another
    writer, form their app's group without a digest."""
    fields = SessionSql(store.database)
    e = fields.expr
    clause, params, _ = fields.where(where)
    rows = fields.query(
        f"SELECT {e['app']} AS app, {e['app_version']} AS version, {e['app_digest']} AS "
        f"digest, COUNT(*) AS n, SUM({e['status']} = 'error') AS errors, AVG({e['reward']}) "
        f"AS mean, MIN(s.created_at) AS first_at, MAX(s.created_at) AS last_at "
        f"FROM session_traces s{clause} GROUP BY app, version, digest "
        f"ORDER BY app, last_at DESC LIMIT ?", params + [int(limit)])
    return [IdentityGroup(app_id=r["app"], app_version=_str(r["version"]),
                          app_digest=_str(r["digest"]), sessions=int(r["n"]),
                          errors=int(r["errors"] or 0), mean_reward=_float(r["mean"]),
                          first_at=_str(r["first_at"]), last_at=_str(r["last_at"]))
            for r in rows]


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _distinct_by_index(fields: SessionSql, column: str, cap: int = 500) -> list[str]:
    # One index seek per value: a million rows with a dozen apps cost a dozen seeks.
    found: list[str] = []
    last: Any = None
    while len(found) < cap:
        if last is None:
            row = fields.query(f"SELECT MIN({column}) AS v FROM session_traces s")[0]
        else:
            row = fields.query(f"SELECT MIN({column}) AS v FROM session_traces s "
                               f"WHERE {column} > ?", (last,))[0]
        if row["v"] is None:
            break
        last = row["v"]
        found.append(str(last))
    return found


def _distinct_in_sample(fields: SessionSql, expr: str, sample: int) -> list[str]:
    rows = fields.query(f"SELECT DISTINCT v FROM (SELECT {expr} AS v FROM session_traces s "
                        "ORDER BY s.created_at DESC LIMIT ?) WHERE v IS NOT NULL "
                        "ORDER BY v LIMIT 500", (sample,))
    return [str(r["v"]) for r in rows]


__all__ = [
    "COUNT_CAP",
    "SORT_KEYS",
    "IdentityGroup",
    "SessionPage",
    "SessionRow",
    "browse_sessions",
    "filter_choices",
    "identity_groups",
    "matching_session_ids",
]
