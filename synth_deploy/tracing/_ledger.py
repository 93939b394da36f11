"""`CostLedger`: what rollouts cost, in tokens and in time.

Per rollout: the tokens in and out as the policy reported them (an LM call's counts, else
its OpenAI-style ``usage``), the number of LM calls, LM time (the calls' latencies added
up), wall time (the rollout function, as the server timed it) and environment time (wall
time less LM time: the app's own work, never below zero). Ledgers add up, so a run's ledger
is the sum of its rollouts'; `stored_ledger` sums a whole trace store in SQL.

The dict form (`CostLedger.to_dict`) is what the server puts in a rollout's
``metrics.details.ledger`` (in the response; the stored session's metrics leave it out, as
`ledger_of` gives it back), what the SFT export carries in each example's metadata and what
``--json`` prints; `CostLedger.from_dict` reads it back and tolerates anything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from synth_deploy.tracing._session import Event, SessionTrace

UNKNOWN_MODEL = "(unknown model)"


# Ledgers are values (adding two makes a third) but not frozen: every rollout builds one, and
# a frozen dataclass's __init__ costs three times a plain one (17k instructions against 6k).
@dataclass
class ModelTokens:
    """Tokens one model took in and gave out."""

    input_tokens: int = 0
    output_tokens: int = 0

    def __add__(self, other: ModelTokens) -> ModelTokens:
        return ModelTokens(self.input_tokens + other.input_tokens,
                           self.output_tokens + other.output_tokens)


@dataclass
class CostLedger:
    """Tokens and time of one rollout, or of many added together."""

    rollouts: int = 0
    lm_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    lm_s: float = 0.0
    env_s: float = 0.0
    wall_s: float = 0.0
    by_model: Mapping[str, ModelTokens] = field(default_factory=dict)
    cost_usd: float | None = None  # what the app recorded on its LM calls, if anything

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: CostLedger) -> CostLedger:
        models = dict(self.by_model)
        for name, tokens in other.by_model.items():
            models[name] = models.get(name, ModelTokens()) + tokens
        cost = (None if self.cost_usd is None and other.cost_usd is None
                else (self.cost_usd or 0.0) + (other.cost_usd or 0.0))
        return CostLedger(
            rollouts=self.rollouts + other.rollouts, lm_calls=self.lm_calls + other.lm_calls,
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            lm_s=self.lm_s + other.lm_s, env_s=self.env_s + other.env_s,
            wall_s=self.wall_s + other.wall_s, by_model=models, cost_usd=cost)

    @classmethod
    def total(cls, ledgers: Iterable[CostLedger | None]) -> CostLedger:
        """The sum of ``ledgers`` (None entries skipped)."""
        out = cls()
        for ledger in ledgers:
            if ledger is not None:
                out = out + ledger
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"rollouts": self.rollouts, "lm_calls": self.lm_calls,
                "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "lm_s": _rounded(self.lm_s, 1e6), "env_s": _rounded(self.env_s, 1e6),
                "wall_s": _rounded(self.wall_s, 1e6),
                "by_model": {name: {"input_tokens": t.input_tokens,
                                    "output_tokens": t.output_tokens}
                             for name, t in self.by_model.items()} if self.by_model else {},
                "cost_usd": None if self.cost_usd is None else _rounded(self.cost_usd, 1e9)}

    @classmethod
    def from_dict(cls, data: Any) -> CostLedger | None:
        """A ledger from its dict form; None when ``data`` is not one. Fields that are
        missing or of the wrong type count as zero: the dict may come from another server."""
        if not isinstance(data, Mapping):
            return None
        models = data.get("by_model") if isinstance(data.get("by_model"), Mapping) else {}
        return cls(
            rollouts=_int(data.get("rollouts"), 1), lm_calls=_int(data.get("lm_calls")),
            input_tokens=_int(data.get("input_tokens")),
            output_tokens=_int(data.get("output_tokens")),
            lm_s=_float(data.get("lm_s")), env_s=_float(data.get("env_s")),
            wall_s=_float(data.get("wall_s")),
            by_model={str(name): ModelTokens(_int(t.get("input_tokens")),
                                             _int(t.get("output_tokens")))
                      for name, t in models.items() if isinstance(t, Mapping)},
            cost_usd=_float(data["cost_usd"]) if _number(data.get("cost_usd")) else None)


def event_tokens(event: Event) -> tuple[int | None, int | None]:
    """An LM call's (input, output) tokens as the policy reported them: the event's counts,
    else its ``usage`` (OpenAI's ``prompt_tokens``/``completion_tokens``, or the
    ``input_tokens``/``output_tokens`` other APIs answer); None where nothing says."""
    tokens_in = event.input_tokens if _number(event.input_tokens) else None
    tokens_out = event.output_tokens if _number(event.output_tokens) else None
    usage = event.usage if isinstance(event.usage, Mapping) else None
    if usage is not None:
        if tokens_in is None:
            tokens_in = _first_count(usage, "prompt_tokens", "input_tokens")
        if tokens_out is None:
            tokens_out = _first_count(usage, "completion_tokens", "output_tokens")
    return (None if tokens_in is None else int(tokens_in),
            None if tokens_out is None else int(tokens_out))


def ledger_of(session: SessionTrace, *, wall_s: float | None = None) -> CostLedger:
    """One rollout's ledger. ``wall_s``: the rollout's wall time when the caller timed it;
    else the session's ``duration_s`` (the server's timing); else 0: unknown (synth-ai's
    sessions), and the environment time with it."""
    lm_calls = tokens_in = tokens_out = 0
    lm_s = 0.0
    cost: float | None = None
    models: dict[str, ModelTokens] = {}
    for step in session.timesteps:
        for event in step.events:
            if event.event_type != "cais":
                continue
            lm_calls += 1
            if _number(event.latency_ms):
                lm_s += max(float(event.latency_ms), 0.0) / 1000.0
            if _number(event.cost_usd):
                cost = (cost or 0.0) + float(event.cost_usd)
            got_in, got_out = event_tokens(event)
            tokens_in += got_in or 0
            tokens_out += got_out or 0
            name = event.model_name or UNKNOWN_MODEL
            models[name] = models.get(name, ModelTokens()) + ModelTokens(got_in or 0,
                                                                          got_out or 0)
    wall = wall_s
    if wall is None:
        metadata = session.metadata
        wall = _float(metadata.get("duration_s") if isinstance(metadata, Mapping) else None)
    return CostLedger(rollouts=1, lm_calls=lm_calls, input_tokens=tokens_in,
                      output_tokens=tokens_out, lm_s=lm_s, env_s=max(wall - lm_s, 0.0),
                      wall_s=wall, by_model=models, cost_usd=cost)


def ledger_from_rows(lm_rows: Iterable[tuple[Any, ...]], wall_s: Any) -> CostLedger:
    """One stored session's ledger from its LM calls grouped by model (rows of
    ``(model_name, calls, tokens_in, tokens_out, lm_ms, cost)``, cost in dollars:
    `stored_cost_sql`) and its wall time."""
    by_model: dict[str, ModelTokens] = {}
    calls = tokens_in = tokens_out = 0
    lm_s = 0.0
    cost: float | None = None
    for name, n, got_in, got_out, lm_ms, usd in lm_rows:
        got_in, got_out = _int(got_in), _int(got_out)
        tokens_in += got_in
        tokens_out += got_out
        calls += _int(n)
        lm_s += _float(lm_ms) / 1000.0
        if _number(usd):
            cost = (cost or 0.0) + float(usd)
        name = name or UNKNOWN_MODEL
        before = by_model.get(name)
        by_model[name] = ModelTokens(got_in, got_out) if before is None \
            else before + ModelTokens(got_in, got_out)
    wall = _float(wall_s)
    return CostLedger(rollouts=1, lm_calls=calls, input_tokens=tokens_in,
                      output_tokens=tokens_out, lm_s=lm_s, env_s=max(wall - lm_s, 0.0),
                      wall_s=wall, by_model=by_model, cost_usd=cost)


def stored_cost_sql(schema_version: int) -> str:
    """An LM call's cost in dollars, in SQL over ``events``: synth-ai stores cents
    (int(cost_usd * 100)); its rows are those without our event_uid (every row before
    schema version 2)."""
    if schema_version < 2:
        return "cost_usd / 100.0"
    return "CASE WHEN event_uid IS NULL THEN cost_usd / 100.0 ELSE cost_usd END"


Query = Callable[..., list[dict[str, Any]]]

# The wall time of every session (its metadata's duration_s), and the LM calls by model from
# the index that holds their tokens and latencies (schema version 5).
_WALL_SQL = ("SELECT COUNT(*) AS rollouts, SUM(CAST(json_extract(metadata, '$.duration_s') "
             "AS REAL)) AS wall_s FROM session_traces")
_MODEL_SQL = ("SELECT model_name, COUNT(*) AS calls, SUM(input_tokens) AS tokens_in, "
              "SUM(output_tokens) AS tokens_out, SUM(latency_ms) AS lm_ms FROM events "
              "WHERE event_type = 'cais' GROUP BY model_name")


def stored_ledger(query: Query, cost_usd: float | None = None) -> CostLedger:
    """The ledger of every session in a store, from its tables (``query(sql)`` → rows).

    Environment time is the total wall time less the total LM time; sessions stored without
    a wall time (synth-ai's, older ones) add their tokens and LM time only.
    """
    times = query(_WALL_SQL)[0]
    rows = query(_MODEL_SQL)
    models = {(r["model_name"] or UNKNOWN_MODEL): ModelTokens(int(r["tokens_in"] or 0),
                                                              int(r["tokens_out"] or 0))
              for r in rows}
    lm_s = sum(max(float(r["lm_ms"] or 0.0), 0.0) for r in rows) / 1000.0
    wall_s = max(float(times["wall_s"] or 0.0), 0.0)
    return CostLedger(
        rollouts=int(times["rollouts"] or 0), lm_calls=sum(int(r["calls"] or 0) for r in rows),
        input_tokens=sum(t.input_tokens for t in models.values()),
        output_tokens=sum(t.output_tokens for t in models.values()),
        lm_s=lm_s, env_s=max(wall_s - lm_s, 0.0), wall_s=wall_s, by_model=models,
        cost_usd=cost_usd or None)


def _rounded(value: float, scale: float) -> float:
    """``value`` to the nearest 1/``scale`` (``round(value, 6)`` for 1e6, give or take an
    exact half), without the decimal conversion `round` does for its digits: 3k
    instructions, three times a rollout. Out of range (inf, nan, huge) it is left as it is."""
    scaled = value * scale
    return round(scaled) / scale if -1e15 < scaled < 1e15 else value


def _number(value: Any) -> bool:
    kind = type(value)
    if kind is int or kind is float:  # what SQLite and JSON give: the common case, first
        return value == value
    return isinstance(value, int | float) and kind is not bool and value == value


def _int(value: Any, default: int = 0) -> int:
    return int(value) if _number(value) and value >= 0 else default


def _float(value: Any) -> float:
    return float(value) if _number(value) and value >= 0 else 0.0


def _first_count(usage: Mapping[str, Any], *names: str) -> int | None:
    for name in names:
        if _number(usage.get(name)):
            return int(usage[name])
    return None


__all__ = ["UNKNOWN_MODEL", "CostLedger", "ModelTokens", "event_tokens", "ledger_from_rows",
           "ledger_of", "stored_cost_sql", "stored_ledger"]
