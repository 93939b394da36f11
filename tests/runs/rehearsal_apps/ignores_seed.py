"""Draws its problem from a module-level RNG: the seed in the request changes nothing."""

import random

from sums import correct, problem

from synth_deploy.taskapp import TaskApp, call_policy

task_app = TaskApp("rehearse-unseeded", name="Ignores its seed",
                   description="A new problem on every call, whatever the seed.")
_rng = random.Random()


@task_app.instances
def instances(seeds):
    return [task_app.instance(seed, question=problem(_rng.randint(0, 10**6))[0])
            for seed in seeds]


@task_app.rollout
async def rollout(request, ctx):
    question, answer = problem(_rng.randint(0, 10**6))
    reply = await call_policy(ctx, [{"role": "user", "content": question}])
    ctx.tracer.record_outcome_reward(float(correct(reply.content, answer)))
