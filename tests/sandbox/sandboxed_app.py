"""A task app whose rollout runs the request's command in a sandbox (served by the tests as
`synth-deploy serve` would, in a child process). ``env.config``: ``command`` (a shell line),
``timeout_s``; the sandboxes live under $SANDBOX_TEST_ROOT."""

import os

from synth_deploy.sandbox import LocalBackend, SandboxSettings, use_backend
from synth_deploy.taskapp import RolloutContext, RolloutRequest, TaskApp

use_backend(LocalBackend(os.environ["SANDBOX_TEST_ROOT"]))

task_app = TaskApp("sandboxed", name="Sandboxed", description="Runs a command in a sandbox.",
                   sandbox=SandboxSettings(command_timeout_s=120, timeout_s=300,
                                           max_file_mb=16, max_processes=32))


@task_app.rollout
async def rollout(request: RolloutRequest, ctx: RolloutContext) -> dict:
    box = await ctx.sandbox()
    ctx.tracer.start_timestep("run", turn_number=1)
    result = await box.run(request.env.config.get("command", "true"),
                           timeout_s=float(request.env.config.get("timeout_s", 60)))
    ctx.tracer.record_outcome_reward(float(result.ok))
    return {"metrics": {"details": {"exit_code": result.exit_code, "limit": result.limit}}}
