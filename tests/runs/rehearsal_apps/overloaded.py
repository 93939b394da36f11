"""Holds 4 rollouts at once; the 5th in flight fails with "overloaded"."""

import asyncio

from sums import correct, problem

from synth_deploy.taskapp import TaskApp, call_policy

CAPACITY = 4

task_app = TaskApp("rehearse-overloaded", name="Gives way past 4",
                   description="Fails rollouts beyond 4 in flight.")
_in_flight = 0


@task_app.rollout
async def rollout(request, ctx):
    global _in_flight
    _in_flight += 1
    try:
        if _in_flight > CAPACITY:
            raise RuntimeError(f"overloaded: {_in_flight} rollouts in flight, "
                               f"capacity {CAPACITY}")
        await asyncio.sleep(0.05)  # long enough for concurrent rollouts to overlap
        question, answer = problem(request.env.seed or 0)
        reply = await call_policy(ctx, [{"role": "user", "content": question}])
        ctx.tracer.record_outcome_reward(float(correct(reply.content, answer)))
    finally:
        _in_flight -= 1
