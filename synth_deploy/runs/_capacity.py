"""Capacity: ramp rollout concurrency 1, 2, 4, … until errors pass 1% or p99 passes the
rollout budget; find the knee and recommend the trainer's and Modal's concurrency.

    report = probe_capacity(target, LoadOptions(max_concurrency=32, budget_s=120))
    report.sustained, report.knee, report.recommend(wanted=8)

Each level runs its rollouts at exactly that concurrency (the trainer's semaphore), so a level's
p50/p99 is what a rollout waits at that load and rollouts/s what the app delivers.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from synth_deploy.errors import UsageError
from synth_deploy.runs._rollouts import (
    RolloutOutcome,
    RunOptions,
    _percentile,
    rollout_request,
    run_rollouts,
)
from synth_deploy.runs._suite import RunTarget, store_returned_traces
from synth_deploy.runs._trainer_plan import fold_run_ids

ERROR_RATE_LIMIT = 0.01
# A level within this share of the best throughput is as good: the knee is the first of them.
KNEE_SHARE = 0.9
MIN_ROLLOUTS_PER_LEVEL = 4

BodyFactory = Callable[[int, str], tuple[int, dict[str, Any]]]  # (index, run id) -> seed, body


@dataclass(frozen=True)
class LoadOptions:
    """How far and how hard to ramp.

    ``max_concurrency``: the last level; ``wanted``: the concurrency the trainer will use
    (always one of the levels); ``rollouts_per_level``: default ``max(4, 2 × level)``;
    ``budget_s``: the rollout budget a level's p99 must stay under.
    """

    max_concurrency: int = 16
    budget_s: float = 300.0
    wanted: int | None = None
    rollouts_per_level: int | None = None
    error_rate_limit: float = ERROR_RATE_LIMIT

    def __post_init__(self) -> None:
        if self.max_concurrency < 1:
            raise UsageError(f"the capacity ramp needs a limit of at least 1, got "
                             f"{self.max_concurrency}")
        if self.budget_s <= 0:
            raise UsageError(f"the rollout budget must be positive, got {self.budget_s:g}")
        if self.rollouts_per_level is not None and self.rollouts_per_level < 1:
            raise UsageError("rollouts per level must be at least 1")

    def levels(self) -> list[int]:
        """1, 2, 4, … up to ``max_concurrency``, plus ``wanted`` when it is below the limit."""
        levels = {2 ** i for i in range(int(math.log2(self.max_concurrency)) + 1)}
        levels.add(self.max_concurrency)
        if self.wanted and self.wanted <= self.max_concurrency:
            levels.add(self.wanted)
        return sorted(levels)

    def rollouts_at(self, level: int) -> int:
        return self.rollouts_per_level or max(MIN_ROLLOUTS_PER_LEVEL, 2 * level)


@dataclass
class LoadLevel:
    """What one concurrency level delivered."""

    concurrency: int
    outcomes: list[RolloutOutcome]
    wall_s: float
    budget_s: float
    error_rate_limit: float = ERROR_RATE_LIMIT

    @property
    def rollouts(self) -> int:
        return len(self.outcomes)

    @property
    def errors(self) -> int:
        return sum(not o.ok for o in self.outcomes)

    @property
    def error_rate(self) -> float:
        return self.errors / self.rollouts if self.rollouts else 0.0

    def latency(self, q: int) -> float | None:
        return _percentile(sorted(o.latency_s for o in self.outcomes), q)

    @property
    def rollouts_per_s(self) -> float:
        return (self.rollouts - self.errors) / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def rate(self) -> str:
        """The throughput as a reader can use it: per minute (or hour) below one a second."""
        per_s = self.rollouts_per_s
        if per_s >= 1 or per_s == 0:
            return f"{per_s:.1f} rollouts/s"
        if per_s * 60 >= 1:
            return f"{per_s * 60:.1f} rollouts/min"
        return f"{per_s * 3600:.1f} rollouts/h"

    @property
    def problem(self) -> str | None:
        """Why this level is past what the app sustains (None: it held)."""
        if self.error_rate > self.error_rate_limit:
            cause = Counter(fold_run_ids(o.error or f"HTTP {o.status}") for o in self.outcomes
                            if not o.ok).most_common(1)[0][0]
            return (f"{self.errors}/{self.rollouts} rollouts failed "
                    f"({self.error_rate:.0%} > {self.error_rate_limit:.0%}): {cause}")
        p99 = self.latency(99)
        if p99 is not None and p99 > self.budget_s:
            return f"p99 {p99:.2f}s is over the rollout budget {self.budget_s:g}s"
        return None

    def to_dict(self) -> dict[str, Any]:
        p50, p99 = self.latency(50), self.latency(99)
        return {"concurrency": self.concurrency, "rollouts": self.rollouts,
                "errors": self.errors, "p50_s": None if p50 is None else round(p50, 4),
                "p99_s": None if p99 is None else round(p99, 4),
                "rollouts_per_s": round(self.rollouts_per_s, 4), "problem": self.problem}


@dataclass
class CapacityReport:
    """The ramp's levels, how far the app held, and what to set."""

    options: LoadOptions
    levels: list[LoadLevel] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def held(self) -> list[LoadLevel]:
        """The levels before the first one past what the app sustains."""
        held = []
        for level in self.levels:
            if level.problem:
                break
            held.append(level)
        return held

    @property
    def sustained(self) -> int:
        """The highest concurrency that held (0: not even one rollout at a time)."""
        held = self.held
        return held[-1].concurrency if held else 0

    @property
    def stopped_by(self) -> LoadLevel | None:
        return next((level for level in self.levels if level.problem), None)

    @property
    def knee(self) -> LoadLevel | None:
        """The first held level within 10% of the best throughput: more only queues."""
        held = self.held
        if not held:
            return None
        best = max(level.rollouts_per_s for level in held)
        return next(level for level in held if level.rollouts_per_s >= KNEE_SHARE * best)

    def recommend(self, wanted: int | None = None) -> dict[str, int | None]:
        """``max_concurrent_rollouts`` (the wanted value if it held, else the sustained one)
        and Modal's ``concurrent_inputs`` (the knee: one container's useful concurrency) and
        ``max_containers`` (enough containers of that size for the trainer's concurrency)."""
        knee = self.knee
        if knee is None:
            return {"max_concurrent_rollouts": None, "concurrent_inputs": None,
                    "max_containers": None}
        concurrency = min(wanted, self.sustained) if wanted else self.sustained
        per_container = knee.concurrency
        return {"max_concurrent_rollouts": concurrency, "concurrent_inputs": per_container,
                "max_containers": math.ceil((wanted or concurrency) / per_container)}

    def to_dict(self, wanted: int | None = None) -> dict[str, Any]:
        knee, stopped = self.knee, self.stopped_by
        return {"levels": [level.to_dict() for level in self.levels],
                "sustained": self.sustained,
                "knee": None if knee is None else {"concurrency": knee.concurrency,
                                                   "rollouts_per_s": round(knee.rollouts_per_s,
                                                                           2)},
                "stopped_by": None if stopped is None else stopped.problem,
                "max_concurrency": self.options.max_concurrency,
                "budget_s": self.options.budget_s, "wanted": wanted,
                "recommended": self.recommend(wanted), "notes": self.notes}


async def ramp_capacity(target: RunTarget, options: LoadOptions, body_for: BodyFactory, *,
                        tag: str,
                        on_level_start: Callable[[int, int], None] | None = None,
                        on_outcome: Callable[[RolloutOutcome], None] | None = None
                        ) -> CapacityReport:
    """Run the levels in order; stop after the first one the app does not sustain."""
    report = CapacityReport(options)
    counter = itertools.count()
    for concurrency in options.levels():
        count = options.rollouts_at(concurrency)
        if on_level_start is not None:
            on_level_start(concurrency, count)
        seeds, bodies = [], []
        for _ in range(count):
            index = next(counter)
            seed, body = body_for(index, f"rehearse-{tag}-load-{index}")
            seeds.append(seed)
            bodies.append(body)
        started = time.perf_counter()
        outcomes = await run_rollouts(
            target.url, target.api_key, seeds, target.policy,
            # Measured as they come: a failure is where the app gives way, never retried
            # or cut short.
            RunOptions(mode="rl", concurrency=concurrency, max_time_s=options.budget_s,
                       retries=0, stop_after_failures=None),
            return_trace=target.trace_store is not None, on_outcome=on_outcome, bodies=bodies)
        level = LoadLevel(concurrency, outcomes, time.perf_counter() - started,
                          options.budget_s, options.error_rate_limit)
        store_returned_traces(target, outcomes)
        report.levels.append(level)
        if level.problem:
            break
    return report


def probe_capacity(target: RunTarget, options: LoadOptions, *,
                   on_level_start: Callable[[int, int], None] | None = None,
                   on_outcome: Callable[[RolloutOutcome], None] | None = None
                   ) -> CapacityReport:
    """The capacity ramp alone (`check --load`): smoke-style rl rollouts on seeds 0, 1, …"""
    from synth_deploy.tunnel import concurrency_cap

    limit, capped = concurrency_cap(target.url, options.max_concurrency)
    if capped:
        from dataclasses import replace

        options = replace(options, max_concurrency=limit)
    run_options = RunOptions(mode="rl", max_time_s=options.budget_s)

    def body_for(index: int, run_id: str) -> tuple[int, dict[str, Any]]:
        body = rollout_request(index, target.policy, run_options,
                               return_trace=target.trace_store is not None)
        return index, {**body, "run_id": run_id}

    tag = f"{int(time.time()):x}"
    report = asyncio.run(ramp_capacity(target, options, body_for, tag=tag,
                                       on_level_start=on_level_start, on_outcome=on_outcome))
    report.notes[:0] = list(target.notes) + ([capped] if capped else [])
    return report


__all__ = ["ERROR_RATE_LIMIT", "CapacityReport", "LoadLevel", "LoadOptions", "probe_capacity",
           "ramp_capacity"]
