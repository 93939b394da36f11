"""Rollouts take 1.2 s; the app declares a Modal function timeout of 1 s."""

import asyncio

from sums import correct, problem

from synth_deploy.modal import ModalSettings
from synth_deploy.taskapp import TaskApp, call_policy

ROLLOUT_S = 1.2

task_app = TaskApp("rehearse-slow", name="Outlives its timeout",
                   description="Rollouts outlive the declared Modal timeout.",
                   modal=ModalSettings(name="synth-rehearse-slow", timeout=1))


@task_app.rollout
async def rollout(request, ctx):
    await asyncio.sleep(ROLLOUT_S)
    question, answer = problem(request.env.seed or 0)
    reply = await call_policy(ctx, [{"role": "user", "content": question}])
    ctx.tracer.record_outcome_reward(float(correct(reply.content, answer)))
