"""Small task app configs for server tests: each misbehaves (or not) in one precise way."""

from __future__ import annotations

import asyncio
import time

from synth_deploy.taskapp import (
    InvalidAction,
    Reward,
    RolloutContext,
    RolloutRequest,
    Step,
    TaskApp,
    TaskDescriptor,
    TaskInfo,
    function_tool,
)
from synth_deploy.taskapp.config import ProxyConfig, TaskAppConfig


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


def sleeping(seconds: float, *, fail: bool = False):
    """A rollout that waits ``seconds`` (``env.config.sleep`` overrides it), then rewards 1.0
    or, with ``fail``, crashes: an episode of many minutes, scaled, behind a proxy."""
    async def rollout(request: RolloutRequest, ctx: RolloutContext) -> dict:
        await asyncio.sleep(float(request.env.config.get("sleep", seconds)))
        if fail:
            raise RuntimeError("the environment crashed after a long while")
        ctx.tracer.record_outcome_reward(1.0)
        return {"run_id": request.run_id, "metrics": {"episode_rewards": [1.0]}}
    return rollout


def slow_sync_rollout(request: RolloutRequest, ctx: RolloutContext) -> dict:
    time.sleep(float(request.env.config.get("sleep", 0.2)))
    return {"run_id": request.run_id, "metrics": {"episode_returns": [0.5]}}


def proxy_config(openai_base_url: str) -> TaskAppConfig:
    return toy_config(proxy=ProxyConfig(enable_openai=True, enable_groq=True,
                                        openai_base_url=openai_base_url,
                                        groq_base_url=openai_base_url + "/groq"))


class CountEnv:
    """Count to a target: each step adds 1, 2 or 3; reward 1 for landing on it exactly, and a
    ``progress`` reward each step. Refuses other numbers (`InvalidAction`)."""

    tool = function_tool("add", "Add 1, 2 or 3 to the total.", {
        "type": "object", "properties": {"n": {"type": "integer", "enum": [1, 2, 3]}},
        "required": ["n"]})
    noop = {"n": 1}
    closed = 0  # environments closed, over every instance

    def reset(self, seed, *, episode_id, config):
        self.total, self.target = 0, 3 + (seed or 0) % 5 + int(config.get("extra", 0))
        return self._observation()

    def _observation(self):
        return {"text": f"Reach {self.target} exactly; the total is {self.total}.",
                "total": self.total, "target": self.target}

    def step(self, action):
        n = action.get("n")
        if n not in (1, 2, 3):
            raise InvalidAction(f"n must be 1, 2 or 3, got {n!r}")
        self.total += n
        done = self.total >= self.target
        return Step(self._observation(), reward=float(self.total == self.target), done=done,
                    info={"added": n}, state={"total": self.total},
                    rewards=[Reward("progress", n / self.target)])

    def state(self):
        return {"total": self.total}

    def close(self):
        CountEnv.closed += 1


def env_config(factory=CountEnv, *, app_id: str = "count", **settings) -> TaskAppConfig:
    """A task app whose episodes the kit derives from ``factory`` (default `CountEnv`)."""
    task_app = TaskApp(app_id, name="Toy", description="Count to a target.", **settings)
    task_app.environment(factory)
    return task_app.build_config()
