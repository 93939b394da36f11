"""The environment of OpenEnv's scaling benchmark (burtenshaw/openenv-scaling,
benchmark/server/benchmark_environment.py), rebuilt on OpenEnv's own classes: a sync ``step``
that blocks in ``time.sleep(action.wait_seconds)`` and holds no CPU while it waits, so what a
crowd of sessions measures is the server's overhead, not the environment. Needs openenv; both
servers of bench/openenv_sessions.py serve this one class."""

import os
import time
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class WaitAction(Action):
    """Wait, as an environment step that takes that long would."""

    wait_seconds: float = Field(default=0.0, ge=0, description="How long the step takes")


class WaitObservation(Observation):
    waited_seconds: float = 0.0
    pid: int = 0
    step_count: int = 0


class WaitEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs) -> WaitObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return WaitObservation(pid=os.getpid())

    def step(self, action: WaitAction) -> WaitObservation:  # type: ignore[override]
        self._state.step_count += 1
        if action.wait_seconds > 0:
            time.sleep(action.wait_seconds)
        return WaitObservation(waited_seconds=action.wait_seconds, pid=os.getpid(),
                               step_count=self._state.step_count, reward=0.0)

    @property
    def state(self) -> State:
        return self._state
