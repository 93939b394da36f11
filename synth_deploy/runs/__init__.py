"""Runs against a task app: smoke and eval rollouts, the rehearsal of a training run, and the
mock policy they default to.

    from synth_deploy.runs import RunOptions, run_suite

    report = run_suite("math", range(10), env, options=RunOptions(concurrency=8))
    report = rehearse(load_config("rl.toml"), "math", env)    # before renting GPUs

An app id or file is served here (`synth_deploy.serving.LocalRunner`, with an ephemeral key);
a URL is driven as it is, with the configured ``ENVIRONMENT_API_KEY``.
"""

from synth_deploy._lazy import lazy_attributes
from synth_deploy.runs._capacity import CapacityReport, LoadLevel, LoadOptions, probe_capacity
from synth_deploy.runs._idle import IdleResult, idle_probe
from synth_deploy.runs._measured import (
    MEASURED_CAPACITY_FILE,
    MeasuredCapacity,
    capacity_warnings,
    measured_capacity,
    record_capacity,
)
from synth_deploy.runs._rehearsal import RehearsalOptions, RehearsalProgress, rehearse
from synth_deploy.runs._rehearsal_report import RehearsalCheck, RehearsalReport
from synth_deploy.runs._rescore import rescore_app
from synth_deploy.runs._rollouts import (
    PolicyTarget,
    RolloutOutcome,
    RolloutPath,
    RunOptions,
    RunReport,
    path_notes,
    rollout_ledger,
    rollout_request,
    run_ledger,
    run_rollouts,
)
from synth_deploy.runs._suite import (
    POLICY_API_KEY,
    RunTarget,
    default_seeds,
    default_split,
    is_url,
    open_target,
    policy_target,
    run_seeds,
    run_suite,
    serve_mock_policy,
)
from synth_deploy.runs._trainer_plan import TrainerPlan, plan_from_config, trainer_request

# The mock policy imports starlette: only when a run needs it.
__getattr__ = lazy_attributes(__name__, {"MOCK_MODEL": "_mock_policy",
                                         "create_mock_policy_app": "_mock_policy",
                                         "ToyTokenizer": "_toy_tokenizer"})


__all__ = [
    "MEASURED_CAPACITY_FILE",
    "MOCK_MODEL",
    "POLICY_API_KEY",
    "CapacityReport",
    "IdleResult",
    "LoadLevel",
    "LoadOptions",
    "MeasuredCapacity",
    "PolicyTarget",
    "RehearsalCheck",
    "RehearsalOptions",
    "RehearsalProgress",
    "RehearsalReport",
    "RolloutOutcome",
    "RolloutPath",
    "RunOptions",
    "RunReport",
    "RunTarget",
    "ToyTokenizer",
    "TrainerPlan",
    "capacity_warnings",
    "create_mock_policy_app",
    "default_seeds",
    "default_split",
    "idle_probe",
    "is_url",
    "measured_capacity",
    "open_target",
    "plan_from_config",
    "policy_target",
    "probe_capacity",
    "record_capacity",
    "rehearse",
    "rescore_app",
    "rollout_ledger",
    "rollout_request",
    "run_ledger",
    "path_notes",
    "run_rollouts",
    "run_seeds",
    "run_suite",
    "serve_mock_policy",
    "trainer_request",
]
