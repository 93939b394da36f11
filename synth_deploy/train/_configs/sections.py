"""Sections shared by the RL and SFT schemas, and the strict base model they all use.

The schemas are synth-ai 0.4.x's (``synth_ai/sdk/api/train/configs/``), every field it
declares, plus the keys its shipped example configs use. Unlike synth-ai's models, which
allow any key, ours refuse unknown keys: a misspelt key is an error with a did-you-mean
rather than a setting the trainer silently ignores.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from synth_deploy.train._configs.ranges import (
    Count,
    Every,
    Index,
    NonNegative,
    Port,
    Positive,
    Probability,
    TopK,
)


class Section(BaseModel):
    """A TOML table: unknown keys are errors and TOML's own types are taken as they are."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class AlgorithmConfig(Section):
    """``[algorithm]``: online policy gradient (RL) or offline SFT."""

    type: Literal["online", "offline"]
    method: str
    variety: str | None = None


class ComputeConfig(Section):
    """``[compute]``: where the trainer runs."""

    gpu_type: str | None = None
    gpu_count: Count | None = None
    nodes: Count | None = None
    topology: dict[str, Any] | None = None


class LoraConfig(Section):
    """``[training.lora]`` (and the deprecated top-level ``[lora]``)."""

    r: Count | None = None
    alpha: Count | None = None
    dropout: Probability | None = None
    target_modules: list[str] | None = None


class PolicyConfig(Section):
    """``[policy]`` / ``[model]``: the model to train, how to sample from it, how to train it.

    One model, named by ``model_name`` (synth-ai's ``[policy]``), ``base`` (synth-ai's
    ``[model]``; also our older ``[policy]`` spelling), ``model`` (synth-ai's shipped math
    example) or ``source`` (a checkpoint to continue from).
    """

    model_name: str | None = None
    base: str | None = None
    model: str | None = None
    source: str | None = None
    # Sampling (synth-ai's [policy]); the backend fills its own defaults when absent.
    max_tokens: Count | None = None
    temperature: NonNegative | None = None
    top_p: Probability | None = None
    top_k: TopK | None = None
    repetition_penalty: Positive | None = None
    stop_sequences: list[str] | None = None
    inference_url: str | None = None
    trainer_mode: Literal["lora", "qlora", "full"] | None = None
    label: str | None = None

    @model_validator(mode="after")
    def _one_model(self) -> PolicyConfig:
        given = [k for k in ("model_name", "base", "model", "source") if getattr(self, k)]
        names = {getattr(self, k) for k in given if k != "source"}
        if "source" in given and names or len(names) > 1:
            raise ValueError(f"set one model: either source or base/model_name, not "
                             f"{' and '.join(given)}")
        return self

    @property
    def base_model(self) -> str | None:
        """The base model named, whichever key names it."""
        return self.model_name or self.base or self.model

    @property
    def name(self) -> str | None:
        return self.source or self.base_model


__all__ = ["AlgorithmConfig", "ComputeConfig", "Count", "Every", "Index", "LoraConfig",
           "NonNegative", "PolicyConfig", "Port", "Positive", "Probability", "Section"]
