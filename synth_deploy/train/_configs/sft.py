"""The SFT TOML schema: synth-ai 0.4.x's ``SFTConfig`` (``sdk/api/train/configs/sft.py``) and
the keys of the SFT example shipped in its wheel; the value bounds are those its job payload
builder (``prepare_sft_job_payload``) enforces."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from synth_deploy.train._configs.sections import (
    AlgorithmConfig,
    ComputeConfig,
    LoraConfig,
    PolicyConfig,
    Section,
)


class JobConfig(Section):
    """``[job]``: the model to fine-tune and the training data (a JSONL path)."""

    model: str
    data: str | None = None
    data_path: str | None = None
    poll_seconds: int | None = Field(default=None, strict=False)  # synth-ai's: 10.0, not 1.5

    @property
    def dataset(self) -> str | None:
        return self.data or self.data_path  # synth-ai's builder reads `data` first


class SFTDataConfig(Section):
    topology: dict[str, Any] | None = None
    validation_path: str | None = None


class TrainingValidationConfig(Section):
    enabled: bool | None = None
    evaluation_strategy: Literal["steps", "epoch"] | None = None
    eval_steps: int | None = None
    save_best_model_at_end: bool | None = None
    metric_for_best_model: str | None = None
    greater_is_better: bool | None = None


class SFTTrainingConfig(Section):
    # "sft_offline": synth-ai's shipped crafter example.
    mode: Literal["lora", "qlora", "full", "sft_offline"] | None = None
    use_qlora: bool | None = None
    validation: TrainingValidationConfig | None = None
    lora: LoraConfig | None = None


class ParallelismConfig(Section):
    use_deepspeed: bool | None = None
    deepspeed_stage: int | None = None
    fsdp: bool | None = None
    bf16: bool | None = None
    fp16: bool | None = None
    activation_checkpointing: bool | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None


class HyperparametersConfig(Section):
    n_epochs: int = Field(default=1, ge=1)
    batch_size: int | None = Field(default=None, ge=1)
    global_batch: int | None = Field(default=None, ge=1)
    per_device_batch: int | None = Field(default=None, ge=1)
    gradient_accumulation_steps: int | None = Field(default=None, ge=1)
    sequence_length: int | None = Field(default=None, ge=1)
    learning_rate: float | None = Field(default=None, gt=0)
    warmup_ratio: float | None = Field(default=None, ge=0, le=1)
    train_kind: str | None = None
    weight_decay: float | None = None  # declared by synth-ai, not sent by its job builder
    parallelism: ParallelismConfig | None = None


class SFTConfig(Section):
    """A whole SFT config file."""

    type: Literal["sft"] | None = None  # synth-ai's shipped example names its kind
    algorithm: AlgorithmConfig | None = None
    job: JobConfig
    policy: PolicyConfig | None = None
    compute: ComputeConfig | None = None
    data: SFTDataConfig | None = None
    training: SFTTrainingConfig | None = None
    hyperparameters: HyperparametersConfig = HyperparametersConfig()
    tags: dict[str, Any] | None = None
    lora: LoraConfig | None = None  # deprecated: [training.lora]


__all__ = [
    "HyperparametersConfig",
    "JobConfig",
    "ParallelismConfig",
    "SFTConfig",
    "SFTDataConfig",
    "SFTTrainingConfig",
    "TrainingValidationConfig",
]
