"""Wire models of the task app protocol (shared/spec/task-app-protocol.md).

Field names are exact so a trainer built for synth-ai task apps drives ours unchanged.
Every model accepts unknown fields: older and newer clients send extras (``ops``,
``max_ops``...), and failing on them would break trainers for no gain.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class WireModel(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


# --- TaskInfo -------------------------------------------------------------------------


class TaskDescriptor(WireModel):
    id: str
    name: str
    description: str | None = None
    version: str | None = None


class DatasetInfo(WireModel):
    id: str | None = None
    name: str | None = None
    version: str | None = None
    splits: list[str] | None = None
    default_split: str | None = None
    description: str | None = None


class InferenceInfo(WireModel):
    model: str | None = None
    inference_url: str | None = None


class LimitsInfo(WireModel):
    max_turns: int | None = None
    max_response_tokens: int | None = None
    timeout_seconds: int | None = None


class RubricCriterion(WireModel):
    id: str
    description: str
    weight: float | None = None


class RubricSection(WireModel):
    name: str
    criteria: list[RubricCriterion] = Field(default_factory=list)


class RubricInfo(WireModel):
    outcome: RubricSection | None = None
    events: RubricSection | None = None


class TaskInfo(WireModel):
    """What `/task_info?seed=N` returns for one seed: the task instance."""

    task: TaskDescriptor
    environment: str | None = None
    dataset: DatasetInfo = Field(default_factory=DatasetInfo)
    rubric: RubricInfo | None = None
    inference: InferenceInfo = Field(default_factory=InferenceInfo)
    limits: LimitsInfo = Field(default_factory=LimitsInfo)
    task_metadata: dict[str, Any] = Field(default_factory=dict)


# --- Rollout request ------------------------------------------------------------------


class RolloutEnvSpec(WireModel):
    env_id: str | None = None
    env_name: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    seed: int | None = None


# What a trainer sends in ``policy.config`` (the protocol spec; synth-ai's trainers and its
# `task_app validate`): the model, and the OpenAI-compatible base the app calls. The schema
# requires the base, the validator does not: an app that never calls the policy takes a request
# without it, and one that does answers 422 (missing_inference_url), as the schema says.
_POLICY_CONFIG_SCHEMA: dict[str, Any] = {
    "properties": {
        "inference_url": {"type": "string", "pattern": r"^https?://[^\s/?#]+",
                          "description": "the OpenAI-compatible base URL the app calls for "
                                         "every policy step (its query, e.g. ?cid=, is kept)"},
        "model": {"type": "string", "description": "the model's name, sent as is"}},
    "required": ["inference_url"]}


class RolloutPolicySpec(WireModel):
    model_config = ConfigDict(json_schema_extra={"required": ["config"]})

    policy_id: str | None = None
    policy_name: str | None = None
    config: dict[str, Any] = Field(default_factory=dict, json_schema_extra=_POLICY_CONFIG_SCHEMA)
    output_mode: Literal["tool_calls", "text", "structured"] = "tool_calls"
    structured_config: dict[str, Any] | None = None


class RolloutRecordConfig(WireModel):
    logprobs: bool = False
    value: bool = False
    return_trace: bool = False
    trace_format: Literal["compact", "full", "structured"] = "compact"


class RolloutSafetyConfig(WireModel):
    max_time_s: float = Field(default=3600.0, gt=0)
    max_ops: int | None = None


class RolloutRequest(WireModel):
    # As synth-ai's model declares them; ours defaults them, for older and hand-made clients.
    model_config = ConfigDict(json_schema_extra={"required": ["run_id", "env", "policy"]})

    run_id: str = Field(min_length=1)
    env: RolloutEnvSpec = Field(default_factory=RolloutEnvSpec)
    policy: RolloutPolicySpec = Field(default_factory=RolloutPolicySpec)
    record: RolloutRecordConfig = Field(default_factory=RolloutRecordConfig)
    on_done: str = "reset"
    safety: RolloutSafetyConfig = Field(default_factory=RolloutSafetyConfig)
    training_session_id: str | None = None
    synth_base_url: str | None = None
    mode: Literal["rl", "eval"] = "rl"


# --- Rollout response -----------------------------------------------------------------


class RolloutStep(WireModel):
    obs: Any = None
    tool_calls: list[Any] = Field(default_factory=list)
    reward: float | None = None
    done: bool = False
    truncated: bool | None = None
    info: dict[str, Any] | None = None


class RolloutTrajectory(WireModel):
    env_id: str
    policy_id: str
    steps: list[RolloutStep] = Field(default_factory=list)
    final: dict[str, Any] | None = None
    length: int = 0
    inference_url: str | None = None


class RolloutMetrics(WireModel):
    """Rollout metrics; both reward spellings are always emitted.

    Give either ``episode_rewards``/``reward_mean`` (0.4.x) or ``episode_returns``/``mean_return``
    (older docs): the other pair is filled in, so either kind of trainer reads the rewards.
    A reward is a finite number: JSON would carry NaN or an infinity to a trainer as null.
    """

    model_config = ConfigDict(allow_inf_nan=False)

    episode_rewards: list[float] = Field(default_factory=list)
    reward_mean: float = 0.0
    episode_returns: list[float] = Field(default_factory=list)
    mean_return: float = 0.0
    num_steps: int = 0
    num_episodes: int = 1
    outcome_reward: float | None = None
    event_rewards: list[float] | None = None
    outcome_score: float | None = None
    events_score: float | None = None
    details: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _both_spellings(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        rewards = data.get("episode_rewards") or data.get("episode_returns")
        if rewards is None and data.get("outcome_reward") is not None:
            rewards = [data["outcome_reward"]]
        rewards = list(rewards or [])
        mean = data.get("reward_mean", data.get("mean_return"))
        if mean is None:
            mean = sum(rewards) / len(rewards) if rewards else 0.0
        data.setdefault("episode_rewards", rewards)
        data.setdefault("episode_returns", rewards)
        data["reward_mean"] = data["mean_return"] = mean
        return data


def recorded_reward(metrics: Mapping[str, Any]) -> float | None:
    """A rollout's reward as its answer's metrics state it; None when it recorded none (the
    protocol's ``reward_mean`` then reads 0.0: a default, not a reward)."""
    if (reward := metrics.get("outcome_reward")) is not None:
        return reward
    if not (metrics.get("episode_rewards") or metrics.get("episode_returns")
            or metrics.get("reward_mean") or metrics.get("mean_return")):
        return None
    return metrics.get("reward_mean", metrics.get("mean_return"))


NO_REWARD = ("no reward recorded: the rollout returned no outcome_reward or episode_rewards "
             "and recorded none (ctx.tracer.record_outcome_reward); a trainer reads 0 for it")


class RolloutResponse(WireModel):
    run_id: str
    metrics: RolloutMetrics
    trajectories: list[RolloutTrajectory] = Field(default_factory=list)
    branches: dict[str, Any] = Field(default_factory=dict)
    aborted: bool = False
    trace: dict[str, Any] | None = None
    trace_correlation_id: str | None = None
    inference_url: str | None = None
    pipeline_metadata: dict[str, Any] = Field(default_factory=dict)


__all__ = [
    "NO_REWARD",
    "DatasetInfo",
    "InferenceInfo",
    "LimitsInfo",
    "RolloutEnvSpec",
    "RolloutMetrics",
    "RolloutPolicySpec",
    "RolloutRecordConfig",
    "RolloutRequest",
    "RolloutResponse",
    "RolloutSafetyConfig",
    "RolloutStep",
    "RolloutTrajectory",
    "RubricCriterion",
    "RubricInfo",
    "RubricSection",
    "TaskDescriptor",
    "TaskInfo",
    "recorded_reward",
]
