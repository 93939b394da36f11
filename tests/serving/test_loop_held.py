"""The warning that app code held the event loop is about the loop, not the machine: an
environment's async reset or step that computes is named with its file and line, on /rollout
and on OpenEnv's wire, rollouts that hold it back to back once; the kit's own work inside a
rollout is never put on the rollout; a served app kept off its core by another process (its
LLM-bound rollouts under load, a step computing briefly but spanning long) gets no warning;
and the kit sets up nothing on the loop at a first policy call."""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import uuid
from pathlib import Path

import httpx
import pytest
from processes import clean_env, free_port, wait_until_up
from standins.openenv_client import WSEnvClient
from standins.scripted_policy import calls, scripted_policy, tool_call
from toy_apps import CountEnv, env_config, toy_config

from synth_deploy.serving import create_app
from synth_deploy.taskapp import call_policy

HOLD_S = 0.3  # of the loop thread's own CPU, however long the machine makes it
LOAD_S = 5.0


def compute(seconds: float) -> None:
    started = time.thread_time()
    while time.thread_time() - started < seconds:
        pass


class BusyCount(CountEnv):
    """CountEnv whose reset and step are async and compute without awaiting."""

    async def reset(self, seed, *, episode_id, config):
        compute(HOLD_S)
        return CountEnv.reset(self, seed, episode_id=episode_id, config=config)

    async def step(self, action):
        compute(HOLD_S)
        return CountEnv.step(self, action)


def held_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "held the event loop" in r.getMessage()]


def named(method) -> str:
    return f"BusyCount.{method.__name__} ({__file__}:{method.__code__.co_firstlineno})"


def test_an_environments_async_reset_and_step_that_hold_the_loop_are_named(
        serve, api_key, caplog):
    caplog.set_level(logging.WARNING, logger="synth_deploy.taskapp")
    policy = serve(scripted_policy([calls(tool_call("add", {"n": 3}))]))
    server = serve(create_app(env_config(BusyCount), api_keys=[api_key]))
    answer = httpx.post(server.url + "/rollout", headers={"X-API-Key": api_key}, timeout=60,
                        json=body("busy", policy.url + "/v1"))
    assert answer.status_code == 200, answer.text
    warnings = held_warnings(caplog)
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith(named(BusyCount.reset)), warnings
    assert warnings[1].startswith(named(BusyCount.step)), warnings
    assert "worker_object" in warnings[1] and "plain `def`" in warnings[1]


class Together:
    """Rollouts that, once ``n`` have started, all compute at once: their steps run back to
    back in one turn of the loop."""

    def __init__(self, n: int) -> None:
        self.n, self.arrived = n, 0
        self.all_in: asyncio.Event | None = None

    async def __call__(self, request, ctx):
        self.all_in = self.all_in or asyncio.Event()
        self.arrived += 1
        if self.arrived == self.n:
            self.all_in.set()
        await self.all_in.wait()
        compute(HOLD_S / 2)
        return {"run_id": request.run_id, "metrics": {"episode_rewards": [1.0]}}


def test_rollouts_that_hold_the_loop_back_to_back_are_named_once(serve, api_key, caplog):
    caplog.set_level(logging.WARNING, logger="synth_deploy.taskapp")
    server = serve(create_app(toy_config(Together(4)), api_keys=[api_key]))

    async def four() -> list[int]:
        async with httpx.AsyncClient(timeout=60) as client:
            answers = await asyncio.gather(*(
                client.post(server.url + "/rollout", headers={"X-API-Key": api_key},
                            json=body(f"together-{i}", "http://127.0.0.1:9/v1"))
                for i in range(4)))
        return [a.status_code for a in answers]

    assert asyncio.run(four()) == [200] * 4
    warnings = held_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"Together.__call__ ({__file__}:"), warnings


async def long_prompt_rollout(request, ctx):
    # The kit's own work holds the loop here: encoding (and reading back) this prompt.
    await call_policy(ctx, [{"role": "user", "content": "x"}] * 300_000)
    return {"run_id": request.run_id, "metrics": {"episode_rewards": [1.0]}}


def test_the_kits_own_work_inside_a_rollout_is_never_put_on_the_rollout(
        serve, mock_policy, api_key, caplog):
    caplog.set_level(logging.WARNING, logger="synth_deploy.taskapp")
    server = serve(create_app(toy_config(long_prompt_rollout), api_keys=[api_key]))
    answer = httpx.post(server.url + "/rollout", headers={"X-API-Key": api_key}, timeout=60,
                        json=body("long", mock_policy.url + "/v1"))
    assert answer.status_code == 200, answer.text
    assert held_warnings(caplog) == []


def test_an_environments_step_that_holds_the_loop_on_openenvs_wire_is_named(
        serve, api_key, caplog):
    caplog.set_level(logging.WARNING, logger="synth_deploy.taskapp")
    server = serve(create_app(env_config(BusyCount), api_keys=[api_key]))
    with WSEnvClient(server.url + "/openenv", headers={"X-API-Key": api_key}) as env:
        env.reset(seed=0)
        # A beat between them: a step that arrives before the loop's heartbeat runs makes
        # one hold of the two, half each, and a hold no function owns most of is not named.
        time.sleep(0.2)
        env.step({"n": 1})
        env.step({"n": 1})  # said once per function
    warnings = held_warnings(caplog)
    assert [w.split(" held")[0] for w in warnings] == [named(BusyCount.reset),
                                                       named(BusyCount.step)], warnings

LLM_BOUND_APP = '''
from synth_deploy.taskapp import TaskApp, call_policy

task_app = TaskApp("llm-bound", name="llm bound", description="five policy calls")


@task_app.rollout
async def rollout(request, ctx):
    messages = [{"role": "user", "content": "go"}]
    for _ in range(5):
        reply = await call_policy(ctx, messages)
        messages = [*messages, reply.message, {"role": "user", "content": "again"}]
    return {"run_id": request.run_id, "metrics": {"episode_rewards": [1.0]}}
'''


def body(run_id: str, inference_url: str) -> dict:
    return {"run_id": run_id, "env": {"seed": 1}, "mode": "rl",
            "policy": {"config": {"model": "m", "inference_url": inference_url}}}


BRIEF_APP = '''
import time
from synth_deploy.taskapp import TaskApp

task_app = TaskApp("brief", name="brief", description="computes briefly")


@task_app.rollout
async def rollout(request, ctx):
    started = time.thread_time()  # a twentieth of the threshold's CPU, in one step
    while time.thread_time() - started < 0.05:
        pass
    return {"run_id": request.run_id, "metrics": {"episode_rewards": [1.0]}}
'''


def beside_a_hog(tmp_path, source: str, api_key: str, nice: int, client):
    """``client(url)``'s result, slow seconds and the server's output: `synth-deploy serve`
    of ``source`` sharing its core with a process that computes at ``nice``."""
    (tmp_path / "task_app.py").write_text(source)
    port = free_port()
    core = str(sorted(os.sched_getaffinity(0))[0])
    server = subprocess.Popen(
        ["taskset", "-c", core, sys.executable, "-m", "synth_deploy.cli", "serve",
         str(tmp_path / "task_app.py"), "--port", str(port), "--no-trace"],
        cwd=tmp_path, env=clean_env(ENVIRONMENT_API_KEY=api_key), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    hog = None
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(url, server)
        hog = subprocess.Popen(["taskset", "-c", core, "nice", "-n", str(nice), sys.executable,
                                "-c", "while True: pass"])
        started = time.monotonic()
        result = client(url)
        slow_s = time.monotonic() - started
    finally:
        if hog is not None:
            hog.kill()
            hog.wait(5)
        server.terminate()
        output = server.communicate(timeout=15)[0]
    return result, slow_s, output


needs_taskset = pytest.mark.skipif(not shutil.which("taskset"), reason="needs taskset")


@pytest.mark.slow
@needs_taskset
def test_an_llm_bound_app_under_load_kept_off_its_core_is_not_told_it_held_the_loop(
        tmp_path, mock_policy, api_key):
    async def load(url: str) -> list[int]:
        # 32 connections, each sending episodes one after another for LOAD_S.
        until = time.monotonic() + LOAD_S
        limits = httpx.Limits(max_connections=32)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            async def connection(i: int) -> list[int]:
                statuses = []
                while not statuses or time.monotonic() < until:
                    answer = await client.post(url + "/rollout", headers={
                        "X-API-Key": api_key}, json=body(f"held-{i}-{len(statuses)}",
                                                         mock_policy.url + "/v1"))
                    statuses.append(answer.status_code)
                return statuses
            return [s for c in await asyncio.gather(*(connection(i) for i in range(32)))
                    for s in c]

    # The hog has the highest priority: the server runs a sliver of each scheduling period,
    # so a step of a millisecond spans many.
    statuses, slow_s, output = beside_a_hog(tmp_path, LLM_BOUND_APP, api_key, -20,
                                            lambda url: asyncio.run(load(url)))
    assert len(statuses) >= 32 and set(statuses) == {200}, output[-2000:]
    assert slow_s > LOAD_S  # the server really was kept waiting
    assert "held the event loop" not in output, output[-2000:]


@pytest.mark.slow
@needs_taskset
def test_a_step_that_computes_briefly_kept_off_its_core_is_not_told_it_held_the_loop(
        tmp_path, api_key):
    def one(url: str) -> int:
        return httpx.post(url + "/rollout", headers={"X-API-Key": api_key}, timeout=60,
                          json=body("brief", "http://127.0.0.1:9/v1")).status_code

    # The hog gets about nine tenths of the core: the step's 0.05 s of CPU spans ~0.5 s.
    status, slow_s, output = beside_a_hog(tmp_path, BRIEF_APP, api_key, -10, one)
    assert status == 200, output[-2000:]
    assert slow_s > 0.3  # the step really spanned more than the threshold
    assert "held the event loop" not in output, output[-2000:]


FIRST_CALL_APP = '''
import asyncio, time
from synth_deploy.taskapp import TaskApp, call_policy

longest = [0.0]


async def monitor():
    # Asks to wake every millisecond: the CPU its thread spent between two wake-ups is the
    # longest the loop was held (thread CPU: other processes on the machine do not count).
    while True:
        before = time.thread_time()
        await asyncio.sleep(0.001)
        longest[0] = max(longest[0], time.thread_time() - before)


def start(state):
    state["monitor"] = asyncio.get_running_loop().create_task(monitor())


def stop(state):
    state["monitor"].cancel()


task_app = TaskApp("first-call", name="first call", description="one policy call",
                   startup_hooks=[start], shutdown_hooks=[stop])


@task_app.rollout
async def rollout(request, ctx):
    longest[0] = 0.0
    await call_policy(ctx, [{"role": "user", "content": "hi"}])
    await asyncio.sleep(0.005)  # the monitor wakes after the call's last step
    return {"run_id": request.run_id, "metrics": {"episode_rewards": [1.0],
                                                   "details": {"longest_s": longest[0]}}}
'''


def test_the_first_policy_call_holds_the_loop_no_longer_than_the_hundredth(
        tmp_path, mock_policy, api_key):
    (tmp_path / "task_app.py").write_text(FIRST_CALL_APP)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "synth_deploy.cli", "serve", str(tmp_path / "task_app.py"),
         "--port", str(port), "--no-trace"], cwd=tmp_path,
        env=clean_env(ENVIRONMENT_API_KEY=api_key), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    held = []
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(url, server)
        with httpx.Client(timeout=30) as client:
            for i in range(100):
                answer = client.post(url + "/rollout", headers={"X-API-Key": api_key},
                                     json=body(f"first-{i}", mock_policy.url + "/v1"))
                assert answer.status_code == 200, answer.text
                held.append(answer.json()["metrics"]["details"]["longest_s"])
    finally:
        server.terminate()
        server.wait(15)
    first, late = held[0], max(held[90:])
    assert first < late + 0.01, (first, late)


INSTALLED_ROLLOUT = '''
import time


async def rollout(request, ctx):
    started = time.thread_time()
    while time.thread_time() - started < {hold}:
        pass
    return {{"run_id": request.run_id, "metrics": {{"episode_rewards": [1.0]}}}}
'''


def test_an_app_installed_as_a_package_that_holds_the_loop_is_named(serve, api_key, caplog):
    # An app pip-installed into site-packages is where libraries live; its rollout is still
    # the app's code.
    name = f"sd_installed_app_{uuid.uuid4().hex[:8]}"
    package = Path(sysconfig.get_paths()["purelib"]) / name
    package.mkdir()
    try:
        (package / "__init__.py").write_text("")
        (package / "rollouts.py").write_text(INSTALLED_ROLLOUT.format(hold=HOLD_S))
        rollout = importlib.import_module(f"{name}.rollouts").rollout
        caplog.set_level(logging.WARNING, logger="synth_deploy.taskapp")
        server = serve(create_app(toy_config(rollout), api_keys=[api_key]))
        answer = httpx.post(server.url + "/rollout", headers={"X-API-Key": api_key},
                            json=body("installed", "http://127.0.0.1:9/v1"), timeout=60)
        assert answer.status_code == 200
        warnings = held_warnings(caplog)
        assert len(warnings) == 1, warnings
        assert warnings[0].startswith(
            f"rollout ({package.resolve() / 'rollouts.py'}:5) held the event loop"), warnings
    finally:
        shutil.rmtree(package)
        for module in [m for m in sys.modules if m.startswith(name)]:
            del sys.modules[module]
