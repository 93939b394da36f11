"""Reports 12 steps whatever the config's max_turns: an app that does not honour the cap."""

from synth_deploy.taskapp import TaskApp, call_policy

task_app = TaskApp("rehearse-long-turns", name="Long turns",
                   description="Ignores env.config.max_turns.")


@task_app.rollout
async def rollout(request, ctx):
    await call_policy(ctx, [{"role": "user", "content": "Walk on."}])
    ctx.tracer.record_outcome_reward(float(request.run_id[-1] in "02468ace"))
    return {"metrics": {"num_steps": 12}}
