"""Training jobs: RL/SFT configs (synth-ai's TOML schema), the backend client, job streaming,
and SFT data validation.

    from synth_deploy.train import train, TrainOptions, JobClient, validate_sft_file
"""

from synth_deploy.train._backend import (
    JobClient,
    RetryPolicy,
    backend_url,
    new_idempotency_key,
)
from synth_deploy.train._configs import (
    RLConfig,
    SFTConfig,
    TrainConfig,
    discover_configs,
    load_config,
)
from synth_deploy.train._sft_data import (
    SFTError,
    SFTValidation,
    truncated_copy,
    validate_sft_example,
    validate_sft_file,
)
from synth_deploy.train._stream import (
    EXIT_POLL_TIMEOUT,
    ChartHandler,
    CliHandler,
    JobOutcome,
    JsonHandler,
    StreamHandler,
    sparkline,
    stream_job,
)
from synth_deploy.train._submit import (
    PreflightError,
    TrainOptions,
    TrainResult,
    TrainUI,
    masked,
    train,
)

__all__ = [
    "EXIT_POLL_TIMEOUT",
    "ChartHandler",
    "CliHandler",
    "JobClient",
    "JobOutcome",
    "JsonHandler",
    "PreflightError",
    "RLConfig",
    "RetryPolicy",
    "SFTConfig",
    "SFTError",
    "SFTValidation",
    "StreamHandler",
    "TrainConfig",
    "TrainOptions",
    "TrainResult",
    "TrainUI",
    "backend_url",
    "discover_configs",
    "load_config",
    "masked",
    "new_idempotency_key",
    "sparkline",
    "stream_job",
    "train",
    "truncated_copy",
    "validate_sft_example",
    "validate_sft_file",
]
