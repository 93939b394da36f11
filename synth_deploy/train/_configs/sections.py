"""Sections shared by the RL and SFT schemas, and the strict base model they all use."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


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
    gpu_count: int | None = None
    nodes: int | None = None
    topology: dict[str, Any] | None = None


class LoraConfig(Section):
    """``[training.lora]`` (and the deprecated top-level ``[lora]``)."""

    r: int | None = None
    alpha: int | None = None
    dropout: float | None = None
    target_modules: list[str] | None = None


class PolicyConfig(Section):
    """``[model]`` / ``[policy]``: the model to train, from a base or a checkpoint."""

    source: str | None = None
    base: str | None = None
    trainer_mode: Literal["lora", "qlora", "full"] | None = None
    label: str | None = None

    @property
    def name(self) -> str | None:
        return self.source or self.base


__all__ = ["AlgorithmConfig", "ComputeConfig", "LoraConfig", "PolicyConfig", "Section"]
