"""Episodes stop when told: a turn cap on every environment (the default, the decorator's, the
app's, the request's `env.config.max_turns` that a trainer's `[rollout] max_turns` sends) and
a time budget enforced while a step is still running. Real servers, real HTTP."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest
from processes import run_cli

from synth_deploy.runs import (
    PolicyTarget,
    RunOptions,
    plan_from_config,
    run_rollouts,
    trainer_request,
)
from synth_deploy.serving import create_app
from synth_deploy.taskapp import Step, TaskApp, function_tool
from synth_deploy.taskapp.scaffold import scaffold_app
from synth_deploy.train import load_config

DEFAULT_MAX_TURNS = 100  # the README's default cap


class Forever:
    """Never says done."""

    tool = function_tool("wait", "Wait a turn.", {"type": "object", "properties": {}})

    def reset(self, seed, *, episode_id, config):
        return {"text": "Nothing happens."}

    def step(self, action):
        return Step({"text": "Nothing happens."}, reward=0.1)


def served(serve, api_key, factory=Forever, *, decorator=None, **app_settings):
    task_app = TaskApp("forever", name="Forever", description="Wait.", **app_settings)
    if decorator is None:
        task_app.environment(factory)
    else:
        task_app.environment(**decorator)(factory)
    return serve(create_app(task_app.build_config(), api_keys=[api_key]))


def rollout(server, api_key, policy_url, *, config=None, max_time_s=60.0):
    return httpx.post(server.url + "/rollout", headers={"X-API-Key": api_key}, timeout=30,
                      json={"run_id": "r", "env": {"seed": 0, "config": config or {}},
                            "policy": {"config": {"inference_url": policy_url}},
                            "safety": {"max_time_s": max_time_s}})


def test_an_environment_that_never_ends_stops_at_the_default_cap_and_says_so(
        serve, mock_policy, api_key):
    server = served(serve, api_key)
    resp = rollout(server, api_key, mock_policy.url + "/v1")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    steps = body["trajectories"][0]["steps"]
    assert len(steps) == DEFAULT_MAX_TURNS
    assert steps[-1]["done"] and steps[-1]["truncated"] and not steps[-2]["done"]
    details = body["metrics"]["details"]
    assert details["turn_cap"] == DEFAULT_MAX_TURNS
    assert details["ended"].startswith(f"cut at the turn cap: max_turns={DEFAULT_MAX_TURNS} "
                                       "(the default cap"), details["ended"]
    assert "@task_app.environment" in details["ended"]  # where to set it


@pytest.mark.parametrize(("decorator", "app_settings", "config", "expected", "source"), [
    ({"max_turns": 7}, {}, {}, 7, "the environment's max_turns"),
    (None, {"max_turns": 4}, {}, 4, "the environment's max_turns"),
    ({"max_turns": 7}, {"max_turns": 4}, {}, 7, "the environment's max_turns"),
    ({"max_turns": 7}, {}, {"max_turns": 3}, 3, "env.config.max_turns"),
])
def test_the_cap_is_the_requests_else_the_decorators_else_the_apps(
        serve, mock_policy, api_key, decorator, app_settings, config, expected, source):
    server = served(serve, api_key, decorator=decorator, **app_settings)
    body = rollout(server, api_key, mock_policy.url + "/v1", config=config).json()
    assert len(body["trajectories"][0]["steps"]) == expected
    assert f"max_turns={expected} ({source})" in body["metrics"]["details"]["ended"]


def test_a_bad_cap_is_refused_naming_the_field(serve, mock_policy, api_key):
    server = served(serve, api_key)
    resp = rollout(server, api_key, mock_policy.url + "/v1", config={"max_turns": 0})
    assert resp.status_code == 422, resp.text
    assert "env.config.max_turns" in resp.text
    with pytest.raises(Exception, match="max_turns must be a whole number"):
        TaskApp("bad", name="Bad", description="x").environment(max_turns="ten")(Forever)


def test_an_episode_the_environment_ends_is_not_marked_cut(serve, mock_policy, api_key):
    class Short(Forever):
        def step(self, action):
            return Step({"text": "over"}, reward=1.0, done=True)

    body = rollout(served(serve, api_key, Short, decorator={"max_turns": 1}), api_key,
                   mock_policy.url + "/v1").json()
    assert body["metrics"]["details"]["ended"] == "done at turn 1"
    assert "turn_cap" not in body["metrics"]["details"]


def test_the_rl_configs_max_turns_is_sent_and_cuts_the_episode(tmp_path, serve, mock_policy,
                                                               api_key):
    """init's rl.toml says `max_turns = 5`: the request a rehearsal sends carries it, and the
    environment (which would run to the default cap) stops at 5."""
    scaffold_app("guess", tmp_path)
    plan = plan_from_config(load_config(tmp_path / "guess" / "rl.toml"))
    assert plan.max_turns == 5
    body = trainer_request(plan, seed=0, run_id="rehearse-1", return_trace=False,
                           policy=PolicyTarget(mock_policy.url + "/v1", "mock"), budget_s=60)
    assert body["env"]["config"]["max_turns"] == 5
    server = served(serve, api_key)
    resp = httpx.post(server.url + "/rollout", headers={"X-API-Key": api_key}, json=body,
                      timeout=30)
    assert resp.status_code == 200, resp.text
    assert len(resp.json()["trajectories"][0]["steps"]) == 5


class Slow(Forever):
    """Each step sleeps 2 s on its worker thread; counts its live and closed instances."""

    max_sessions = 1
    live = 0
    closed = threading.Event()
    overlapped = False

    def reset(self, seed, *, episode_id, config):
        return {"text": "slow"}

    def step(self, action):
        Slow.live += 1
        Slow.overlapped |= Slow.live > 1
        time.sleep(2)
        Slow.live -= 1
        return Step({"text": "slow"})

    def close(self):
        Slow.overlapped |= Slow.live > 0  # closed while its step still ran
        Slow.closed.set()


class AsyncSlow(Forever):
    closed = threading.Event()

    async def step(self, action):
        await asyncio.sleep(2)
        return Step({"text": "slow"})

    def close(self):  # on its thread, after the cancelled step
        AsyncSlow.closed.set()


@pytest.mark.parametrize("factory", [Slow, AsyncSlow], ids=["sync-step", "async-step"])
def test_the_time_budget_answers_within_a_second_of_its_end_while_a_step_runs(
        serve, mock_policy, api_key, factory):
    server = served(serve, api_key, factory)
    factory.closed.clear()
    started = time.monotonic()
    resp = rollout(server, api_key, mock_policy.url + "/v1", max_time_s=3)
    answered = time.monotonic() - started
    assert resp.status_code == 504, resp.text
    assert "safety.max_time_s=3s" in resp.text
    assert 3 <= answered < 4, answered
    if factory is AsyncSlow:
        assert AsyncSlow.closed.wait(5)  # the step was cancelled, the instance closed
    if factory is Slow:
        # The abandoned step ends on its thread; only then is the instance closed and its
        # slot (max_sessions = 1) given to the next episode.
        assert Slow.closed.wait(10)
        assert not Slow.overlapped
        policy = PolicyTarget(mock_policy.url + "/v1", "mock")
        outcome, = asyncio.run(run_rollouts(server.url, api_key, [1], policy,
                                            RunOptions(max_time_s=3)))
        assert outcome.status == 504 and not Slow.overlapped


def test_smoke_with_max_time_6_answers_within_7_s_while_steps_sleep_4_s(tmp_path):
    (tmp_path / "sleepy.py").write_text(
        "import time\n"
        "from synth_deploy.taskapp import Step, TaskApp, function_tool\n"
        "task_app = TaskApp('sleepy', name='Sleepy', description='Sleep.')\n"
        "@task_app.environment\n"
        "class Sleepy:\n"
        "    tool = function_tool('wait', 'Wait.', {'type': 'object', 'properties': {}})\n"
        "    def reset(self, seed, *, episode_id, config):\n"
        "        return {'text': 'zzz'}\n"
        "    def step(self, action):\n"
        "        time.sleep(4)\n"
        "        return Step({'text': 'zzz'})\n")
    result = run_cli(tmp_path, "smoke", "sleepy.py", "--seeds", "0", "--max-time", "6",
                     "--json", "--no-trace")
    assert result.returncode == 1, result.stderr  # a rollout failed: its budget was spent
    outcome, = json.loads(result.stdout)["rollouts"]
    assert outcome["status"] == 504 and "max_time_s=6s" in outcome["error"]
    assert outcome["latency_s"] < 7, outcome


def test_smoke_says_when_the_cap_cut_an_episode(tmp_path):
    (tmp_path / "endless.py").write_text(
        "from synth_deploy.taskapp import Step, TaskApp, function_tool\n"
        "task_app = TaskApp('endless', name='Endless', description='Wait.')\n"
        "@task_app.environment(max_turns=3)\n"
        "class Endless:\n"
        "    tool = function_tool('wait', 'Wait.', {'type': 'object', 'properties': {}})\n"
        "    def reset(self, seed, *, episode_id, config):\n"
        "        return {'text': 'zzz'}\n"
        "    def step(self, action):\n"
        "        return Step({'text': 'zzz'})\n")
    result = run_cli(tmp_path, "smoke", "endless.py", "--seeds", "0", "--no-trace")
    assert result.returncode == 0, result.stderr
    assert "cut at the turn cap: max_turns=3" in result.stdout, result.stdout
