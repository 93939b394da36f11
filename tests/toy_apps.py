"""Small task app configs for server tests: each misbehaves (or not) in one precise way."""

from __future__ import annotations

import asyncio
import time

from synth_deploy.taskapp import (
    ProxyConfig,
    RolloutContext,
    RolloutRequest,
    TaskAppConfig,
    TaskDescriptor,
    TaskInfo,
)


def toy_config(rollout=None, *, app_id: str = "toy", **overrides) -> TaskAppConfig:
    """A task app whose rollout is ``rollout`` (default: reward = seed / 10, instantly)."""

    async def default_rollout(request: RolloutRequest, ctx: RolloutContext) -> dict:
        seed = request.env.seed or 0
        ctx.tracer.record_outcome_reward(seed / 10)
        return {"run_id": request.run_id, "metrics": {"episode_rewards": [seed / 10]}}

    def instances(seeds):
        for seed in seeds:
            if seed < 0:
                raise LookupError(f"seed {seed} is negative")
            yield TaskInfo(task=TaskDescriptor(id=app_id, name="Toy"),
                           task_metadata={"seed": seed, "difficulty": "easy"})

    settings = dict(
        app_id=app_id, name="Toy", description="A toy task app for tests.",
        base_task_info=TaskInfo(task=TaskDescriptor(id=app_id, name="Toy")),
        provide_task_instances=instances, rollout=rollout or default_rollout,
    )
    settings.update(overrides)
    return TaskAppConfig(**settings)


async def raising_rollout(request: RolloutRequest, ctx: RolloutContext) -> dict:
    raise RuntimeError(f"environment crashed on seed {request.env.seed}")


async def slow_async_rollout(request: RolloutRequest, ctx: RolloutContext) -> dict:
    await asyncio.sleep(float(request.env.config.get("sleep", 0.2)))
    return {"run_id": request.run_id, "metrics": {"episode_rewards": [1.0]}}


def slow_sync_rollout(request: RolloutRequest, ctx: RolloutContext) -> dict:
    time.sleep(float(request.env.config.get("sleep", 0.2)))
    return {"run_id": request.run_id, "metrics": {"episode_returns": [0.5]}}


def proxy_config(openai_base_url: str) -> TaskAppConfig:
    return toy_config(proxy=ProxyConfig(enable_openai=True, enable_groq=True,
                                        openai_base_url=openai_base_url,
                                        groq_base_url=openai_base_url + "/groq"))
