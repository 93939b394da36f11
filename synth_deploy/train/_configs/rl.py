"""The RL TOML schema: synth-ai 0.4.x's ``RLConfig`` (``sdk/api/train/configs/rl.py``), the
keys of the RL examples shipped in its wheel, and its deprecated spellings (``judge`` is now
``verifier``; the loader warns about each). Its numbers take what synth-ai's take: a value
outside the expected range loads with a warning (`ranges`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from synth_deploy.train._configs.sections import (
    AlgorithmConfig,
    ComputeConfig,
    Count,
    Every,
    Index,
    LoraConfig,
    NonNegative,
    PolicyConfig,
    Port,
    Positive,
    Section,
)


class ServicesConfig(Section):
    """``[services]``: the task app the trainer calls, and an optional verifier."""

    task_url: str | None = None  # required once --task-url / TASK_APP_URL are considered
    verifier_url: str | None = None


class RolloutConfig(Section):
    env_name: str | None = None
    policy_name: str | None = None
    env_config: dict[str, Any] | None = None
    policy_config: dict[str, Any] | None = None
    max_turns: Count | None = None
    episodes_per_batch: Count | None = None
    max_concurrent_rollouts: Count | None = None
    batches_per_step: Count | None = None


class WeightSyncConfig(Section):
    enable: bool | None = None
    targets: list[str] | None = None
    mode: str | None = None
    direct: bool | None = None
    verify_every_k: Every | None = None
    weight_sync_interval: Count | None = None  # synth-ai's crafter example sets it here


class RewardsConfig(Section):
    step_rewards_enabled: bool | None = None
    step_rewards_mode: Literal["off", "decision_stepwise", "env_sparse"] | None = None
    step_rewards_indicator_lambda: float | None = None
    step_rewards_beta: float | None = None
    step_rewards_strategy: str | None = None
    event_rewards_kind: Literal["unique", "absolute"] | None = None


class RLTrainingConfig(Section):
    num_epochs: Count | None = None
    iterations_per_epoch: Count | None = None
    gradient_accumulation_steps: Count | None = None
    max_accumulated_minibatch: Count | None = None
    max_turns: Count | None = None
    batch_size: Count | None = None
    group_size: Count | None = None
    learning_rate: Positive | None = None
    log_interval: Count | None = None
    weight_sync_interval: Count | None = None
    weight_sync: WeightSyncConfig | None = None
    lora: LoraConfig | None = None
    rewards: RewardsConfig | None = None
    # Deprecated flat spellings of [training.rewards] (synth-ai still declares them).
    step_rewards_enabled: bool | None = None
    step_rewards_mode: Literal["off", "decision_stepwise", "env_sparse"] | None = None
    step_rewards_indicator_lambda: float | None = None
    step_rewards_beta: float | None = None
    step_rewards_strategy: str | None = None
    event_rewards_kind: Literal["unique", "absolute"] | None = None
    # Reward shaping of synth-ai's shipped math example.
    reward_positive: float | None = None
    reward_negative_no_tool: float | None = None
    reward_negative_no_answer: float | None = None


class RLDataConfig(Section):
    """``[data]`` of synth-ai's shipped math example: which seeds and splits rollouts use."""

    split: str | None = None
    seed_start: Index | None = None
    episodes_per_iteration: Count | None = None
    evaluation_split: str | None = None
    evaluation_episodes: Count | None = None


class EvaluationConfig(Section):
    instances: Count | None = None
    every_n_iters: Count | None = None
    seeds: list[Index] | None = None


class RewardBlend(Section):
    env: float | None = None
    event: float | None = None
    outcome: float | None = None


class VerifierOptionsConfig(Section):
    event: bool | None = None
    outcome: bool | None = None
    provider: str | None = None
    model: str | None = None
    rubric_id: str | None = None
    rubric_overrides: dict[str, Any] | None = None
    # A bound, not a warning: synth-ai's verifier schema (verifier_schemas.py) refuses it too.
    timeout_s: float | None = Field(default=None, gt=0)
    metadata: dict[str, Any] | None = None
    tracks: list[str] | None = None
    weights: dict[str, NonNegative] | None = None
    max_concurrency: Count | None = None


class VerifierConfig(Section):
    type: str | None = None
    timeout_s: Count | None = None
    enabled: bool | None = None
    reward_blend: RewardBlend | None = None
    rubric: dict[str, Any] | None = None  # deprecated: enabled / reward_blend
    options: VerifierOptionsConfig | None = None


class SmokeConfig(Section):
    """``[smoke]``: read by the CLI's smoke runner only; never sent to the backend."""

    task_url: str | None = None
    env_name: str | None = None
    policy_name: str | None = None
    max_steps: Count | None = None
    policy: str | None = None
    model: str | None = None
    mock_backend: str | None = None
    mock_port: Port | None = None
    return_trace: bool | None = None
    use_mock: bool | None = None
    task_app_name: str | None = None
    task_app_port: Port | None = 8765
    task_app_env_file: str | None = None
    task_app_force: bool | None = None
    sqld_auto_start: bool | None = None
    sqld_db_path: str | None = None
    sqld_hrana_port: Port | None = None
    sqld_http_port: Port | None = None


class RLConfig(Section):
    """A whole RL config file. Deprecated sections are accepted (the loader warns)."""

    type: Literal["rl"] | None = None  # synth-ai's shipped examples name their kind
    algorithm: AlgorithmConfig
    services: ServicesConfig | None = None
    compute: ComputeConfig | None = None
    model: PolicyConfig | None = None
    policy: PolicyConfig | None = None
    rollout: RolloutConfig | None = None
    data: RLDataConfig | None = None
    training: RLTrainingConfig | None = None
    evaluation: EvaluationConfig | None = None
    verifier: VerifierConfig | None = None
    vllm: dict[str, Any] | None = None
    tags: dict[str, Any] | None = None
    smoke: SmokeConfig | None = None
    # Deprecated spellings, still read by the backend.
    lora: LoraConfig | None = None
    topology: dict[str, Any] | None = None
    reference: dict[str, Any] | None = None
    rubric: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_model(self) -> RLConfig:
        # synth-ai's shipped math example sets both: [model].base and [policy] sampling.
        named = {s.name for s in (self.model, self.policy) if s is not None and s.name}
        if len(named) > 1:
            shown = " and ".join(sorted(named))
            raise ValueError(f"[model] and [policy] name different models ({shown}): name "
                             "the model in one of them")
        return self

    @property
    def policy_section(self) -> PolicyConfig | None:
        """The section that names the model ([policy] first, as synth-ai prefers)."""
        for section in (self.policy, self.model):
            if section is not None and section.name:
                return section
        return self.policy or self.model


__all__ = [
    "EvaluationConfig",
    "RLConfig",
    "RLDataConfig",
    "RLTrainingConfig",
    "RewardBlend",
    "RewardsConfig",
    "RolloutConfig",
    "ServicesConfig",
    "SmokeConfig",
    "VerifierConfig",
    "VerifierOptionsConfig",
    "WeightSyncConfig",
]
