"""RL and SFT training configs (TOML): schemas, loading with clear errors, discovery.

``file`` holds `TrainConfig` (one config file, read and checked) and the discovery walk;
``rl`` and ``sft`` the two schemas; ``sections`` the tables both share; ``ranges`` the
ranges their numbers are expected in (warned about, as synth-ai admits more); ``compat`` the
warnings for what synth-ai 0.4.x would read differently.
"""

from synth_deploy.train._configs.file import (
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
