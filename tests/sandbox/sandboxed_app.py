"""A task app whose rollout runs the request's command in a sandbox (served by the tests as
`synth-deploy serve` would, in a child process). ``env.config``: ``command`` (a shell line),
``timeout_s``. Its sandboxes: local ones under $SANDBOX_TEST_ROOT, or, with
$SANDBOX_TEST_MODAL_STATE, Modal's as the stand-in plays them (state in that folder)."""

import os
import sys

from synth_deploy.sandbox import LocalBackend, ModalBackend, SandboxSettings, use_backend
from synth_deploy.taskapp import RolloutContext, RolloutRequest, TaskApp

if state := os.environ.get("SANDBOX_TEST_MODAL_STATE"):
    sys.path.insert(0, os.environ["SANDBOX_TEST_TESTS"])
    from standins.modal_sandbox import ModalSandboxStandin

    use_backend(ModalBackend("synth-sandboxed", modal=ModalSandboxStandin(state), lease_s=2.0))
else:
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
