"""`traces stats`: a store's sessions, tokens, time and cost, overall and per app and model.

Read from the running totals the file keeps (`_totals`): a few small rows whatever the
store's size. Files opened read-only at a schema without them are summed from their rows:
the same answers, slower.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from synth_deploy.tracing._db import _totals
from synth_deploy.tracing._db._database import TraceDatabase
from synth_deploy.tracing._ledger import CostLedger, ledger_from_calls
from synth_deploy.tracing._times import zoned


@dataclass(frozen=True)
class TraceStats:
    """Totals for `traces stats` and `traces where`."""

    sessions: int = 0
    ok: int = 0
    errors: int = 0
    timesteps: int = 0
    events: int = 0
    messages: int = 0
    lm_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    first_at: str | None = None
    last_at: str | None = None
    by_app: list[dict[str, Any]] = field(default_factory=list)
    by_model: list[dict[str, Any]] = field(default_factory=list)
    ledger: CostLedger = field(default_factory=CostLedger)  # tokens and LM/env/wall time

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "ledger": self.ledger.to_dict()}


def store_stats(db: TraceDatabase) -> TraceStats:
    """Counts, tokens, time and cost, overall and per app and model (the module docstring
    says where they are read from)."""
    q = db.query
    groups = q(_totals.session_groups(db.fields, db.schema_version))
    models = q(_totals.model_groups(db.schema_version))
    by_app = _by_app(groups)
    cost = float(sum(m["cost_usd"] or 0.0 for m in models))
    # Two index seeks (one aggregate each, so SQLite can use its min/max shortcut).
    first = q("SELECT MIN(created_at) AS v FROM session_traces")[0]["v"]
    last = q("SELECT MAX(created_at) AS v FROM session_traces")[0]["v"]
    return TraceStats(
        sessions=_total(groups, "sessions"),
        ok=sum(g["sessions"] for g in groups if g["status"] == "ok"),
        errors=sum(a["errors"] for a in by_app),
        timesteps=_total(groups, "timesteps"),
        events=_total(groups, "events"),
        messages=_total(groups, "messages"),
        lm_calls=_total(models, "lm_calls"),
        input_tokens=_total(models, "input_tokens"),
        output_tokens=_total(models, "output_tokens"),
        cost_usd=cost, first_at=zoned(first), last_at=zoned(last), by_app=by_app,
        by_model=_by_model(models),
        ledger=dataclasses.replace(ledger_from_calls(
            ((m["model"], m["lm_calls"], m["input_tokens"], m["output_tokens"],
              m["latency_sum"], m["cost_usd"]) for m in models),
            wall_s=sum(g["wall_s"] or 0.0 for g in groups),
            rollouts=_total(groups, "sessions")), cost_usd=cost or None))


def _total(rows: list[dict[str, Any]], column: str) -> int:
    return sum(int(row[column] or 0) for row in rows)


def _by_app(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Sessions, errors and mean reward per app (groups are per app and status), busiest
    first."""
    apps: dict[Any, dict[str, Any]] = {}
    for g in groups:
        app = apps.setdefault(g["app_id"], {"app_id": g["app_id"], "sessions": 0,
                                            "errors": 0, "reward_sum": 0.0, "rewards": 0})
        app["sessions"] += g["sessions"]
        app["errors"] += g["sessions"] if g["status"] == "error" else 0
        app["reward_sum"] += g["reward_sum"] or 0.0
        app["rewards"] += g["rewards"] or 0
    rows = [{"app_id": a["app_id"], "sessions": a["sessions"], "errors": a["errors"],
             "mean_reward": a["reward_sum"] / a["rewards"] if a["rewards"] else None}
            for a in apps.values()]
    return sorted(rows, key=lambda a: -a["sessions"])


def _by_model(models: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """LM calls, tokens and mean latency per model, busiest first."""
    rows = [{"model": m["model"], "lm_calls": m["lm_calls"], "input_tokens": m["input_tokens"],
             "output_tokens": m["output_tokens"],
             "mean_latency_ms": m["latency_sum"] / m["latencies"] if m["latencies"] else None}
            for m in models]
    return sorted(rows, key=lambda m: -m["lm_calls"])


__all__ = ["TraceStats", "store_stats"]
