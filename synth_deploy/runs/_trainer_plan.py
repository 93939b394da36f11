"""What one training step asks of a task app, read from an RL config as the trainer reads it.

`TrainerPlan` holds the numbers a rehearsal replays (episodes, groups, concurrency, steps) and
`trainer_request` builds the `/rollout` body a trainer sends: the config's env and policy
settings, ``mode = "rl"``, and a correlation id appended to the policy URL (``?cid=``).

Fields are read through the loaded config object, defensively (``getattr``), so that a schema
that grows new fields or spellings keeps working here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from synth_deploy.errors import UsageError
from synth_deploy.runs._rollouts import PolicyTarget

# synth-ai's [policy] default: a trainer samples, so the members of a group differ.
TRAINER_DEFAULT_TEMPERATURE = 0.7
_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "max_tokens", "repetition_penalty")
_RUN_ID = re.compile(r"rehearse-[0-9a-z-]+")
# Where a config may state the trainer's per-rollout timeout (not part of synth-ai 0.4.4's
# schema; read when the loaded schema carries it).
_TRAINER_TIMEOUT_FIELDS = ("timeout_s", "rollout_timeout_s")


def _get(section: Any, name: str) -> Any:
    if section is None:
        return None
    if isinstance(section, dict):
        return section.get(name)
    return getattr(section, name, None)


@dataclass(frozen=True)
class TrainerPlan:
    """One training step's rollouts and the run's length, from the RL config."""

    config_path: str
    episodes_per_batch: int
    group_size: int
    max_concurrent_rollouts: int
    batches_per_step: int = 1
    iterations_per_epoch: int | None = None
    num_epochs: int | None = None
    env_name: str | None = None
    policy_name: str | None = None
    env_config: dict[str, Any] = field(default_factory=dict)
    max_turns: int | None = None  # [rollout] max_turns: sent as env.config.max_turns
    sampling: dict[str, Any] = field(default_factory=dict)  # sent in policy.config
    model: str | None = None  # the model the run trains (shown, never called)
    trainer_timeout_s: float | None = None
    trainer_timeout_source: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def rollouts_per_step(self) -> int:
        return self.episodes_per_batch * self.batches_per_step

    @property
    def groups(self) -> int:
        return math.ceil(self.rollouts_per_step / self.group_size)

    @property
    def steps(self) -> int | None:
        """Training steps in the whole run (``iterations_per_epoch × num_epochs``)."""
        if self.iterations_per_epoch is None:
            return None
        return self.iterations_per_epoch * (self.num_epochs or 1)

    def group_seeds(self, seed_start: int = 0) -> list[tuple[int, int]]:
        """(group index, seed) for every rollout of the step: one seed per group."""
        pairs = []
        for index in range(self.rollouts_per_step):
            group = index // self.group_size
            pairs.append((group, seed_start + group))
        return pairs

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config_path, "episodes_per_batch": self.episodes_per_batch,
                "batches_per_step": self.batches_per_step, "group_size": self.group_size,
                "groups": self.groups, "max_concurrent_rollouts": self.max_concurrent_rollouts,
                "iterations_per_epoch": self.iterations_per_epoch,
                "num_epochs": self.num_epochs, "steps": self.steps,
                "env_name": self.env_name, "policy_name": self.policy_name,
                "max_turns": self.max_turns, "sampling": self.sampling, "model": self.model,
                "trainer_timeout_s": self.trainer_timeout_s, "notes": list(self.notes)}


def plan_from_config(config: Any) -> TrainerPlan:
    """The `TrainerPlan` of a loaded RL config (`synth_deploy.train.load_config`)."""
    where = str(getattr(config, "path", "the config"))
    if getattr(config, "kind", "rl") != "rl":
        raise UsageError(f"{where} is an SFT config: a rehearsal replays an RL training step",
                         hint="pass the RL config (e.g. apps/math/configs/rl.toml)")
    model = getattr(config, "model", config)
    rollout, training = _get(model, "rollout"), _get(model, "training")
    notes: list[str] = []

    def positive(section: Any, table: str, name: str, *, required: bool) -> int | None:
        return _positive(where, section, table, name, required=required)

    episodes = positive(rollout, "rollout", "episodes_per_batch", required=True)
    concurrency = positive(rollout, "rollout", "max_concurrent_rollouts", required=True)
    group_size = positive(training, "training", "group_size", required=True)
    batches = positive(rollout, "rollout", "batches_per_step", required=False) or 1
    if episodes % group_size:
        notes.append(f"episodes_per_batch ({episodes}) is not a multiple of group_size "
                     f"({group_size}): the last group is short")

    policy_section = _get(model, "policy") or _get(model, "model")
    sampling = _sampling(policy_section, rollout, notes)
    model_name = next((v for v in (_get(policy_section, n) for n in ("model_name", "source",
                                                                        "base")) if v), None)
    timeout_s, timeout_source = _trainer_timeout(rollout, where)
    return TrainerPlan(
        config_path=where, episodes_per_batch=episodes, group_size=group_size,
        max_concurrent_rollouts=concurrency, batches_per_step=batches,
        iterations_per_epoch=positive(training, "training", "iterations_per_epoch",
                                      required=False),
        num_epochs=positive(training, "training", "num_epochs", required=False),
        env_name=_get(rollout, "env_name"), policy_name=_get(rollout, "policy_name"),
        env_config=dict(_get(rollout, "env_config") or {}),
        max_turns=positive(rollout, "rollout", "max_turns", required=False), sampling=sampling,
        model=model_name, trainer_timeout_s=timeout_s, trainer_timeout_source=timeout_source,
        notes=tuple(notes))


def _positive(where: str, section: Any, table: str, name: str, *, required: bool
              ) -> int | None:
    """A setting that must be a positive integer; `UsageError` naming it when it is not (or
    when it is required and not set)."""
    value = _get(section, name)
    if value is None:
        if required:
            raise UsageError(f"{where}: [{table}] {name} is not set",
                             hint=f"the trainer needs it; set {table}.{name} in the config")
        return None
    if not isinstance(value, int) or value < 1:
        raise UsageError(f"{where}: [{table}] {name} must be a positive integer, "
                         f"got {value!r}")
    return value


def _sampling(policy_section: Any, rollout: Any, notes: list[str]) -> dict[str, Any]:
    """The policy's sampling settings, [rollout] policy_config over them; synth-ai's
    temperature (noted) when none is given."""
    sampling: dict[str, Any] = {}
    for name in _SAMPLING_FIELDS:
        if (value := _get(policy_section, name)) is not None:
            sampling[name] = value
    sampling.update(_get(rollout, "policy_config") or {})
    if "temperature" not in sampling:
        sampling["temperature"] = TRAINER_DEFAULT_TEMPERATURE
        notes.append(f"no sampling temperature in the config: using {TRAINER_DEFAULT_TEMPERATURE}"
                     " (synth-ai's default)")
    return sampling


def _trainer_timeout(rollout: Any, where: str) -> tuple[float | None, str | None]:
    """The trainer's per-rollout timeout and where it was set, if the config says it."""
    for name in _TRAINER_TIMEOUT_FIELDS:
        value = _get(rollout, name)
        if isinstance(value, int | float) and value > 0:
            return float(value), f"{where}: [rollout] {name}"
    return None, None


def fold_run_ids(message: str) -> str:
    """An error message with the rehearsal's run ids folded to ``<run>``, so that the same
    failure on many rollouts reads (and counts) as one."""
    return _RUN_ID.sub("<run>", message)


def with_correlation_id(inference_url: str, cid: str) -> str:
    """``inference_url`` with the trainer's ``?cid=`` appended (an existing query kept)."""
    return f"{inference_url}{'&' if '?' in inference_url else '?'}cid={cid}"


def trainer_request(plan: TrainerPlan, *, seed: int, run_id: str, policy: PolicyTarget,
                    budget_s: float, return_trace: bool, cid: str | None = None,
                    temperature: float | None = None) -> dict[str, Any]:
    """The `/rollout` body a trainer sends for one member of a group."""
    config: dict[str, Any] = {**plan.sampling, "model": policy.model,
                              "inference_url": with_correlation_id(policy.inference_url,
                                                                   cid or run_id)}
    if temperature is not None:
        config["temperature"] = temperature
    if policy.api_key:
        config["api_key"] = policy.api_key
    env: dict[str, Any] = {"seed": seed, "config": dict(plan.env_config)}
    if plan.max_turns is not None:  # the episode's turn cap, where task apps read it
        env["config"].setdefault("max_turns", plan.max_turns)
    if plan.env_name:
        env["env_name"] = plan.env_name
    spec: dict[str, Any] = {"config": config}
    if plan.policy_name:
        spec["policy_name"] = plan.policy_name
    return {"run_id": run_id, "env": env, "policy": spec, "mode": "rl", "on_done": "reset",
            "record": {"return_trace": return_trace, "trace_format": "structured"},
            "safety": {"max_time_s": budget_s}}


__all__ = ["TRAINER_DEFAULT_TEMPERATURE", "TrainerPlan", "fold_run_ids", "plan_from_config",
           "trainer_request", "with_correlation_id"]
