"""Running work against task apps and the training backend: smoke, eval, train.

    from synth_deploy.jobs import train, TrainOptions, JobClient, validate_sft_file
"""

from synth_deploy.jobs.backend import JobClient, RetryPolicy, backend_url, new_idempotency_key
from synth_deploy.jobs.configs import TrainConfig, discover_configs, load_config
from synth_deploy.jobs.rollouts import PolicyTarget, RolloutOutcome, RunReport, run_rollouts
from synth_deploy.jobs.runs import RunTarget, default_seeds, open_target, run_seeds, run_suite
from synth_deploy.jobs.sft_data import (
    SFTError,
    SFTValidation,
    truncated_copy,
    validate_sft_example,
    validate_sft_file,
)
from synth_deploy.jobs.stream import JobOutcome, stream_job
from synth_deploy.jobs.train import PreflightError, TrainOptions, TrainResult, TrainUI, train

__all__ = [
    "JobClient",
    "JobOutcome",
    "PolicyTarget",
    "PreflightError",
    "RetryPolicy",
    "RolloutOutcome",
    "RunReport",
    "RunTarget",
    "SFTError",
    "SFTValidation",
    "TrainConfig",
    "TrainOptions",
    "TrainResult",
    "TrainUI",
    "backend_url",
    "default_seeds",
    "discover_configs",
    "load_config",
    "new_idempotency_key",
    "open_target",
    "run_rollouts",
    "run_seeds",
    "run_suite",
    "stream_job",
    "train",
    "truncated_copy",
    "validate_sft_example",
    "validate_sft_file",
]
