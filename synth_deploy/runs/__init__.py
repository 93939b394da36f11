"""Runs against a task app: smoke and eval rollouts, and the mock policy they default to.

    from synth_deploy.runs import RunOptions, run_suite

    report = run_suite("math", range(10), env, options=RunOptions(concurrency=8))

An app id or file is served here (`synth_deploy.taskapp.LocalRunner`, with an ephemeral key);
a URL is driven as it is, with the configured ``ENVIRONMENT_API_KEY``.
"""

from synth_deploy.runs._rollouts import (
    PolicyTarget,
    RolloutOutcome,
    RunOptions,
    RunReport,
    rollout_request,
    run_rollouts,
)
from synth_deploy.runs._suite import (
    POLICY_API_KEY,
    RunTarget,
    check_url,
    default_seeds,
    is_url,
    open_target,
    policy_target,
    run_seeds,
    run_suite,
)

_LAZY = {"MOCK_MODEL", "create_mock_policy_app"}


def __getattr__(name: str):
    # The mock policy imports starlette: only when a run needs it.
    if name in _LAZY:
        from synth_deploy.runs import _mock_policy

        return getattr(_mock_policy, name)
    raise AttributeError(f"module 'synth_deploy.runs' has no attribute {name!r}")


__all__ = [
    "MOCK_MODEL",
    "POLICY_API_KEY",
    "PolicyTarget",
    "RolloutOutcome",
    "RunOptions",
    "RunReport",
    "RunTarget",
    "check_url",
    "create_mock_policy_app",
    "default_seeds",
    "is_url",
    "open_target",
    "policy_target",
    "rollout_request",
    "run_rollouts",
    "run_seeds",
    "run_suite",
]
