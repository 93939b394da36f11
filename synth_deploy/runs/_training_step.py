"""One training step, run as the trainer would: groups of rollouts on one seed each, their
rewards and variance, failures and their causes, wall time, tokens.

Under GRPO/GSPO a group's advantage is its rewards minus their mean: a group whose members all
score the same contributes no gradient. How many groups are like that is the headline.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from synth_deploy.runs._rollouts import (
    RolloutOutcome,
    RunOptions,
    failure_breakdown,
    run_ledger,
    run_rollouts,
)
from synth_deploy.runs._suite import RunTarget, store_returned_traces
from synth_deploy.runs._trainer_plan import TrainerPlan, fold_run_ids, trainer_request

# Rewards closer than this are the same reward (floating-point noise is not a signal).
REWARD_EPSILON = 1e-9


@dataclass
class GroupResult:
    """The members of one group: same seed, independent samples of the policy."""

    index: int
    seed: int
    outcomes: list[RolloutOutcome] = field(default_factory=list)

    @property
    def rewards(self) -> list[float]:
        return [float(o.reward) for o in self.outcomes if o.ok and o.reward is not None]

    @property
    def failures(self) -> int:
        return sum(not o.ok for o in self.outcomes)

    @property
    def variance(self) -> float | None:
        rewards = self.rewards
        return statistics.pvariance(rewards) if rewards else None

    @property
    def zero_variance(self) -> bool:
        """Every reward of the group is the same (no learning signal); False with no rewards."""
        rewards = self.rewards
        return bool(rewards) and max(rewards) - min(rewards) <= REWARD_EPSILON

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.index, "seed": self.seed, "rewards": self.rewards,
                "variance": self.variance, "zero_variance": self.zero_variance,
                "failures": self.failures}


@dataclass
class StepResult:
    """One training step's rollouts, grouped."""

    plan: TrainerPlan
    groups: list[GroupResult]
    wall_s: float
    concurrency: int
    tokens: int | None

    @property
    def outcomes(self) -> list[RolloutOutcome]:
        return [o for g in self.groups for o in g.outcomes]

    @property
    def failures(self) -> int:
        return sum(g.failures for g in self.groups)

    @property
    def zero_variance_groups(self) -> int:
        return sum(g.zero_variance for g in self.groups)

    @property
    def groups_without_rewards(self) -> int:
        return sum(not g.rewards for g in self.groups)

    @property
    def projected_run_s(self) -> float | None:
        """Rollout wall time of the whole run: this step's, times the run's steps."""
        steps = self.plan.steps
        return None if steps is None else self.wall_s * steps

    @property
    def max_latency_s(self) -> float | None:
        return max((o.latency_s for o in self.outcomes), default=None)

    def failure_kinds(self) -> dict[str, int]:
        """Failed rollouts by who failed, most first."""
        return failure_breakdown(self.outcomes)

    def causes(self, limit: int = 5) -> list[tuple[str, int]]:
        """The most common failure messages (run ids folded), with their counts."""
        counted = Counter(fold_run_ids(o.error or f"HTTP {o.status}")
                          for o in self.outcomes if not o.ok)
        return counted.most_common(limit)

    def to_dict(self) -> dict[str, Any]:
        outcomes = self.outcomes
        return {"rollouts": len(outcomes), "failures": self.failures,
                "groups": [g.to_dict() for g in self.groups],
                "zero_variance_groups": self.zero_variance_groups,
                "groups_without_rewards": self.groups_without_rewards,
                "causes": [{"error": e, "count": n} for e, n in self.causes()],
                "failure_kinds": self.failure_kinds(),
                "wall_s": round(self.wall_s, 3), "concurrency": self.concurrency,
                "projected_run_s": None if self.projected_run_s is None
                else round(self.projected_run_s, 1),
                "steps": self.plan.steps, "tokens": self.tokens,
                "ledger": ledger.to_dict() if (ledger := run_ledger(outcomes)) else None,
                "max_latency_s": None if self.max_latency_s is None
                else round(self.max_latency_s, 3)}


async def run_training_step(target: RunTarget, plan: TrainerPlan, *, tag: str, seed_start: int,
                            budget_s: float, concurrency: int,
                            on_outcome: Callable[[RolloutOutcome], None] | None = None
                            ) -> StepResult:
    """``episodes_per_batch × batches_per_step`` rollouts at ``concurrency``, grouped."""
    pairs = plan.group_seeds(seed_start)
    bodies = [trainer_request(plan, seed=seed, run_id=f"rehearse-{tag}-step-{i}",
                              policy=target.policy, budget_s=budget_s, return_trace=True)
              for i, (_, seed) in enumerate(pairs)]
    started = time.perf_counter()
    outcomes = await run_rollouts(
        target.url, target.api_key, [seed for _, seed in pairs], target.policy,
        # Every rollout of the step, as a trainer gets it: its retryable failures retried
        # once, none left out.
        RunOptions(mode="rl", concurrency=concurrency, max_time_s=budget_s,
                   stop_after_failures=None),
        return_trace=True, on_outcome=on_outcome, bodies=bodies)
    wall_s = time.perf_counter() - started
    store_returned_traces(target, outcomes)
    groups = [GroupResult(index, seed_start + index) for index in range(plan.groups)]
    for (group, _), outcome in zip(pairs, outcomes, strict=True):
        groups[group].outcomes.append(outcome)
    return StepResult(plan, groups, wall_s, concurrency, tokens_used(outcomes))


def tokens_used(outcomes: Sequence[RolloutOutcome]) -> int | None:
    """Tokens the policy spent in ``outcomes`` (None: no rollout reported any)."""
    counts = [o.tokens for o in outcomes if o.tokens is not None]
    return sum(counts) if counts else None


__all__ = ["REWARD_EPSILON", "GroupResult", "StepResult", "run_training_step", "tokens_used"]
