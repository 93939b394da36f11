"""Training jobs: RL/SFT configs (synth-ai's TOML schema), the backend client, job streaming,
and SFT data validation.

    from synth_deploy.env import load_env
    from synth_deploy.train import TrainOptions, train

    results = train(TrainOptions(configs=["rl.toml"], poll=False), load_env([".env"]))

The caller resolves the `Env` (keys and URLs are read from it, never from the process) and the
`TrainOptions`; both are passed down unchanged.

Modules (private; import from here): ``_submission`` runs `train()` (preflight, submit,
follow), ``_options`` holds `TrainOptions`, ``_job`` turns one config into a `PreparedJob`,
``_backend`` is the HTTP client of the training backend, ``_stream`` follows a job and renders
it, ``_configs`` reads and checks the TOML, ``_payloads`` builds job bodies as synth-ai's
builders do, ``_sft_data`` validates SFT JSONL and ``_sft_tools`` checks and flattens its
tools.
"""

from synth_deploy.train._backend import (
    JobClient,
    RetryPolicy,
    backend_url,
    new_idempotency_key,
    retry_after_s,
)
from synth_deploy.train._configs import (
    RLConfig,
    SFTConfig,
    TrainConfig,
    discover_configs,
    load_config,
)
from synth_deploy.train._job import PreparedJob, masked
from synth_deploy.train._options import TrainOptions
from synth_deploy.train._payloads import POLICY_DEFAULTS, rl_payload, sft_payload
from synth_deploy.train._sft_data import (
    SFTError,
    SFTValidation,
    validate_sft_example,
    validate_sft_file,
)
from synth_deploy.train._sft_tools import upload_copy
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
from synth_deploy.train._submission import PreflightError, TrainResult, TrainUI, train

__all__ = [
    "EXIT_POLL_TIMEOUT",
    "ChartHandler",
    "CliHandler",
    "JobClient",
    "JobOutcome",
    "JsonHandler",
    "POLICY_DEFAULTS",
    "PreflightError",
    "PreparedJob",
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
    "retry_after_s",
    "rl_payload",
    "sft_payload",
    "sparkline",
    "stream_job",
    "train",
    "upload_copy",
    "validate_sft_example",
    "validate_sft_file",
]
