"""`CostLedger`: what rollouts cost, in tokens and in time.

Per rollout: the tokens in and out as the policy reported them (an LM call's counts, else
its OpenAI-style ``usage``), the number of LM calls, LM time (the calls' latencies added
up), wall time (the rollout function, as the server timed it), environment time (wall
time less LM time: the app's own work, never below zero) and sandbox time (the commands
its sandboxes ran, added up: part of the environment time). Ledgers add up, so a run's ledger
is the sum of its rollouts'. Every ledger is built by `ledger_from_calls` from LM calls
grouped by model: `ledger_of` groups a session's in memory; the store groups its rows in
SQL, for one session (the SFT export) or all of them (`traces stats`, from running totals).

The dict form (`CostLedger.to_dict`) is what the server puts in a rollout's
``metrics.details.ledger`` (in the response; the stored session's metrics leave it out, as
`ledger_of` gives it back), what the SFT export carries in each example's metadata and what
``--json`` prints; `CostLedger.from_dict` reads it back and tolerates anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from synth_deploy.tracing._session import Event, SessionTrace

UNKNOWN_MODEL = "(unknown model)"
SANDBOX = "sandbox"  # the system of a sandbox's runtime events (`synth_deploy.sandbox`)


# Ledgers are values (adding two makes a third) but not frozen: every rollout builds one, on
# the served app's event loop, and a frozen dataclass's __init__ costs several times a
# plain one's.
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
    sandbox_s: float = 0.0

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
            wall_s=self.wall_s + other.wall_s, by_model=models, cost_usd=cost,
            sandbox_s=self.sandbox_s + other.sandbox_s)

    @classmethod
    def total(cls, ledgers: Iterable[CostLedger | None]) -> CostLedger:
        """The sum of ``ledgers`` (None entries skipped)."""
        out = cls()
        for ledger in ledgers:
            if ledger is not None:
                out = out + ledger
        return out

    def to_dict(self) -> dict[str, Any]:
        """The dict form; ``sandbox_s`` only where sandboxes ran (an app without them reads
        as it always did)."""
        sandbox = {"sandbox_s": _rounded(self.sandbox_s, 1e6)} if self.sandbox_s else {}
        return {"rollouts": self.rollouts, "lm_calls": self.lm_calls,
                "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "lm_s": _rounded(self.lm_s, 1e6), "env_s": _rounded(self.env_s, 1e6),
                "wall_s": _rounded(self.wall_s, 1e6), **sandbox,
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
            wall_s=_float(data.get("wall_s")), sandbox_s=_float(data.get("sandbox_s")),
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
    calls: dict[str, list[Any]] = {}
    sandbox_ms = 0.0
    for step in session.timesteps:
        for event in step.events:
            if event.event_type != "cais":
                if event.system_instance_id == SANDBOX and _number(event.latency_ms):
                    sandbox_ms += max(float(event.latency_ms), 0.0)
                continue
            got_in, got_out = event_tokens(event)
            model = calls.setdefault(event.model_name or UNKNOWN_MODEL,
                                     [event.model_name, 0, 0, 0, 0.0, None])
            model[1] += 1
            model[2] += got_in or 0
            model[3] += got_out or 0
            if _number(event.latency_ms):
                model[4] += max(float(event.latency_ms), 0.0)
            if _number(event.cost_usd):
                model[5] = (model[5] or 0.0) + float(event.cost_usd)
    if wall_s is None:
        metadata = session.metadata
        wall_s = metadata.get("duration_s") if isinstance(metadata, Mapping) else None
    return ledger_from_calls(calls.values(), wall_s=wall_s, sandbox_s=sandbox_ms / 1000.0)


def ledger_from_calls(calls: Iterable[Sequence[Any]], *, wall_s: Any = None,
                      rollouts: int = 1, sandbox_s: Any = 0.0) -> CostLedger:
    """The ledger of ``rollouts`` rollouts from their LM calls grouped by model and their
    wall time: what every ledger is built from (one session in memory, one stored session,
    a whole store's totals). ``calls``: ``(model_name, calls, tokens_in, tokens_out,
    lm_ms, cost_usd)`` each, cost in dollars or None where none was recorded.

    LM time is the calls' latencies added up; environment time the wall time less LM time,
    never below zero; a wall time that is missing or not a number counts as zero.
    """
    by_model: dict[str, ModelTokens] = {}
    count = tokens_in = tokens_out = 0
    lm_s = 0.0
    cost: float | None = None
    for name, n, got_in, got_out, lm_ms, usd in calls:
        got_in, got_out = _int(got_in), _int(got_out)
        tokens_in += got_in
        tokens_out += got_out
        count += _int(n)
        lm_s += _float(lm_ms) / 1000.0
        if _number(usd):
            cost = (cost or 0.0) + float(usd)
        name = name or UNKNOWN_MODEL
        before = by_model.get(name)
        by_model[name] = ModelTokens(got_in, got_out) if before is None \
            else before + ModelTokens(got_in, got_out)
    wall = _float(wall_s)
    return CostLedger(rollouts=rollouts, lm_calls=count, input_tokens=tokens_in,
                      output_tokens=tokens_out, lm_s=lm_s, env_s=max(wall - lm_s, 0.0),
                      wall_s=wall, by_model=by_model, cost_usd=cost,
                      sandbox_s=_float(sandbox_s))


def _rounded(value: float, scale: float) -> float:
    """``value`` to the nearest 1/``scale`` (``round(value, 6)`` for 1e6, give or take an
    exact half), without the decimal conversion `round` does for its digits (every
    rollout's ledger rounds three values). Out of range (inf, nan, huge) it is left as it
    is."""
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


__all__ = ["UNKNOWN_MODEL", "CostLedger", "ModelTokens", "event_tokens", "ledger_from_calls",
           "ledger_of"]
