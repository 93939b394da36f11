"""The SFT TOML schema."""

from __future__ import annotations

from typing import Any, Literal

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
    poll_seconds: float | None = None

    @property
    def dataset(self) -> str | None:
        return self.data_path or self.data


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
    mode: Literal["lora", "qlora", "full"] | None = None
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
    n_epochs: int = 1
    batch_size: int | None = None
    global_batch: int | None = None
    per_device_batch: int | None = None
    gradient_accumulation_steps: int | None = None
    sequence_length: int = 2048
    learning_rate: float | None = None
    warmup_ratio: float | None = None
    train_kind: str | None = None
    weight_decay: float | None = None
    parallelism: ParallelismConfig | None = None


class SFTConfig(Section):
    """A whole SFT config file."""

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
