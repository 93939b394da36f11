"""Scores every rollout 1.0, whatever the policy answers: no group has any reward variance."""

from sums import problem

from synth_deploy.taskapp import TaskApp, call_policy

task_app = TaskApp("rehearse-constant", name="Constant reward",
                   description="Every rollout scores 1.0.")


@task_app.rollout
async def rollout(request, ctx):
    question, _ = problem(request.env.seed or 0)
    await call_policy(ctx, [{"role": "user", "content": question}])
    ctx.tracer.record_outcome_reward(1.0)
