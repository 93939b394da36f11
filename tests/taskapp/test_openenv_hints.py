"""What an OpenEnv user is told, and can act on: a turn without a valid action (`noop`), a
reset that takes no seed, a WebSocket client given the app's root instead of /openenv. Real
uvicorn, a scripted policy, the kit's mock policy; an OpenEnv-shaped environment written
as OpenEnv's docs write one (the kit never imports openenv)."""

from __future__ import annotations

import random
from pathlib import Path

import httpx
import pytest
from pydantic import BaseModel, ConfigDict, Field
from standins.openenv_client import Rejected, WSEnvClient
from standins.scripted_policy import scripted_policy

from synth_deploy.env import Env
from synth_deploy.errors import TaskAppError
from synth_deploy.runs import RehearsalOptions, rehearse
from synth_deploy.serving import create_app
from synth_deploy.taskapp import TaskApp
from synth_deploy.train import load_config

MATH_RL = Path(__file__).resolve().parents[2] / "apps" / "math" / "configs" / "rl.toml"


class GuessAction(BaseModel):
    """Guess the code."""

    model_config = ConfigDict(extra="forbid")
    metadata: dict = Field(default_factory=dict)
    code: int


class GuessObservation(BaseModel):
    done: bool = False
    reward: float | None = None
    metadata: dict = Field(default_factory=dict)
    text: str = ""


class CodeBreaker:
    """OpenEnv's shape: ``reset()`` without a seed; the code drawn from the global RNG."""

    def reset(self):
        self.code, self.tries = random.randrange(1000), 0
        return GuessObservation(text=f"crack the code ({random.randrange(10**6)} is a hint)")

    def step(self, action):
        self.tries += 1
        right = action.code == self.code
        return GuessObservation(text="right" if right else "wrong", done=right,
                                reward=float(right))

    @property
    def state(self):
        return {"step_count": self.tries}

    def close(self):
        pass


def breaker_app(api_key: str, **openenv):
    task_app = TaskApp("breaker", name="Breaker", description="Crack a code.")
    task_app.openenv(CodeBreaker, GuessAction, max_turns=3, **openenv)
    return create_app(task_app.build_config(), api_keys=[api_key])


def rollout(server, api_key: str, policy_url: str, seed: int = 0) -> dict:
    resp = httpx.post(server.url + "/rollout", headers={"X-API-Key": api_key}, timeout=30,
                      json={"run_id": f"r{seed}", "env": {"seed": seed},
                            "policy": {"config": {"inference_url": policy_url,
                                                  "temperature": 0.0}}})
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_an_episode_cut_for_want_of_a_noop_says_how_to_give_one(serve, api_key):
    policy = serve(scripted_policy(["I will not call a tool."]))
    server = serve(breaker_app(api_key))
    ended = rollout(server, api_key, policy.url + "/v1")["metrics"]["details"]["ended"]
    assert ended.startswith("no valid action at turn 1, twice"), ended
    assert "task_app.openenv(..., noop={...})" in ended, ended  # what an OpenEnv user can do
    assert "`noop = {...}` class attribute holding guess's arguments" in ended, ended


def test_openenvs_noop_plays_on_the_turns_without_a_valid_action(serve, api_key):
    policy = serve(scripted_policy(["I will not call a tool."]))
    server = serve(breaker_app(api_key, noop={"code": -1}))
    body = rollout(server, api_key, policy.url + "/v1")
    steps = body["trajectories"][0]["steps"]
    assert len(steps) == 3 and all(s["info"]["noop_after_invalid_replies"] for s in steps)
    assert body["metrics"]["details"]["ended"] == "truncated at turn 3"


def test_a_noop_that_is_no_action_is_refused_when_declared():
    task_app = TaskApp("breaker-bad", name="Breaker", description="Crack a code.")
    with pytest.raises(TaskAppError) as refused:
        task_app.openenv(CodeBreaker, GuessAction, noop={"guess": 1})
    message = str(refused.value)
    assert "not a valid GuessAction" in message and "code: Field required" in message


def test_determinism_advice_to_a_reset_without_a_seed_says_so(serve, api_key, tmp_path):
    server = serve(breaker_app(api_key))
    rl = (MATH_RL.read_text().replace("episodes_per_batch = 32", "episodes_per_batch = 4")
          .replace("max_concurrent_rollouts = 8", "max_concurrent_rollouts = 2"))
    (tmp_path / "rl.toml").write_text(rl)
    report = rehearse(load_config(tmp_path / "rl.toml"), server.url,
                      Env({"ENVIRONMENT_API_KEY": api_key}),
                      RehearsalOptions(skip=frozenset({"capacity", "idle"})))
    check = next(c for c in report.checks if c.name == "determinism")
    assert check.data["seed_ignored"] == ("CodeBreaker.reset() takes no seed, so seed 0 was "
                                          "not passed")
    assert check.verdict == "fail" and "takes no seed" in check.finding
    assert "add a `seed` parameter to reset()" in check.fix
    assert "request.env.seed" not in check.fix  # advice it cannot follow


def test_a_websocket_at_the_app_root_is_told_the_openenv_base_url(serve, api_key):
    server = serve(breaker_app(api_key))
    with pytest.raises(Rejected) as refused:  # as openenv's client, given the root
        WSEnvClient(server.url, headers={"X-API-Key": api_key}).connect()
    assert refused.value.status == 404, refused.value.body
    assert f"the base URL {server.url}/openenv".encode() in refused.value.body
    with WSEnvClient(server.url + "/openenv", headers={"X-API-Key": api_key}) as env:
        assert env.reset()["observation"]["text"].startswith("crack the code")
