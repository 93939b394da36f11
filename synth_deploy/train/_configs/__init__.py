"""RL and SFT training configs (TOML): schemas, loading with clear errors, discovery."""

from synth_deploy.train._configs.loading import (
    KINDS,
    JobKind,
    TrainConfig,
    discover_configs,
    infer_kind,
    load_config,
    read_toml,
)
from synth_deploy.train._configs.rl import RLConfig
from synth_deploy.train._configs.sft import SFTConfig

__all__ = [
    "KINDS",
    "JobKind",
    "RLConfig",
    "SFTConfig",
    "TrainConfig",
    "discover_configs",
    "infer_kind",
    "load_config",
    "read_toml",
]
