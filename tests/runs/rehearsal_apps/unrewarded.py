"""Records a reward for even seeds only: every other group has no reward to compare."""

from sums import problem

from synth_deploy.taskapp import TaskApp, call_policy

task_app = TaskApp("rehearse-unrewarded", name="Half unrewarded",
                   description="Odd seeds record no reward.")


@task_app.rollout
async def rollout(request, ctx):
    seed = request.env.seed or 0
    question, _ = problem(seed)
    await call_policy(ctx, [{"role": "user", "content": question}])
    if seed % 2 == 0:
        ctx.tracer.record_outcome_reward(float(request.run_id[-1] in "02468ace"))
