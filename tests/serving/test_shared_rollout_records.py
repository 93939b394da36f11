"""Servers sharing one trace store share their async rollouts' records: each answers for a
rollout another runs (its state, a renew, a terminate that reaches the runner), two apps on
the file never answer each other's ids, one id submitted to two server processes at once
runs once, and a runner killed is answered `interrupted` within the bound, never before.
Real `synth-deploy serve` child processes on loopback, one real SQLite file."""

from __future__ import annotations

import asyncio
import gc
import json
import signal
import sqlite3
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import httpx
import pytest
from processes import clean_env, free_port, wait_until_up
from toy_apps import toy_config

from synth_deploy.serving import create_app
from synth_deploy.taskapp import RolloutContext, RolloutRequest
from synth_deploy.tracing import (
    RUNNER_LOST_S,
    TICK_S,
    RolloutRecords,
    TurnTokens,
    open_trace_store,
)

# Each run appends its id to a file: how many times an id ran, whichever process ran it.
COUNTING_APP = '''
import asyncio, os
from synth_deploy.taskapp import TaskApp

task_app = TaskApp("counting", name="Counting", description="Counts its runs.")


@task_app.rollout
async def rollout(request, ctx):
    with open(os.environ["RUNS_FILE"], "a") as runs:
        runs.write(f"{request.run_id} {os.getpid()}\\n")
    await asyncio.sleep(float(request.env.config.get("sleep", 0.2)))
    return {"run_id": request.run_id, "metrics": {"outcome_reward": 1.0}}
'''


def body(rollout_id: str, sleep: float = 0.2, **extra) -> dict:
    return {"rollout_id": rollout_id, "seed": 1, "submission_mode": "async",
            "env": {"config": {"sleep": sleep, **extra}},
            "policy": {"model": "m", "inference_url": "http://127.0.0.1:9/v1"}}


@pytest.fixture
def servers(tmp_path, api_key):
    """servers(n) -> the URLs of n `synth-deploy serve` processes on one trace file."""
    (tmp_path / "counting_app.py").write_text(COUNTING_APP)
    procs: list[subprocess.Popen] = []

    def start(n: int) -> list[str]:
        urls = []
        while len(urls) < n:
            port = free_port()
            proc = subprocess.Popen(
                [sys.executable, "-m", "synth_deploy.cli", "serve", "counting_app.py",
                 "--port", str(port), "--trace-db", str(tmp_path / "t.db")], cwd=tmp_path,
                env=clean_env(ENVIRONMENT_API_KEY=api_key, RUNS_FILE=str(tmp_path / "runs")),
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            try:
                wait_until_up(f"http://127.0.0.1:{port}", proc, timeout_s=60)
            except AssertionError as exc:
                if "address already in use" not in str(exc):  # another test took the port
                    raise
                continue
            procs.append(proc)
            urls.append(f"http://127.0.0.1:{port}")
        return urls

    start.procs = procs
    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def runs(tmp_path: Path) -> list[str]:
    path = tmp_path / "runs"
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []


def test_60_ids_submitted_at_once_to_two_server_processes_each_run_once(tmp_path, servers,
                                                                        api_key):
    a, b = servers(2)
    ids = [f"both-{i}" for i in range(60)]

    async def submit_everywhere() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30, headers={"X-API-Key": api_key}) as c:
            return await asyncio.gather(*(c.post(url + "/containers/rollouts", json=body(i))
                                          for i in ids for url in (a, b)))

    answers = asyncio.run(submit_everywhere())
    assert {r.status_code for r in answers} <= {200, 202}, {r.text for r in answers}
    deadline = time.monotonic() + 30
    with httpx.Client(timeout=30, headers={"X-API-Key": api_key}) as c:
        for rollout_id in ids:
            while (doc := c.get(f"{b}/containers/rollouts/{rollout_id}").json())[
                    "status"] == "running":
                assert time.monotonic() < deadline, doc
                time.sleep(0.05)
            assert doc["status"] == "completed", doc
            assert c.get(f"{a}/containers/rollouts/{rollout_id}").json()["status"] == \
                "completed"
    ran = runs(tmp_path)
    assert sorted(ran) == sorted(ids), f"ran twice: {sorted({i for i in ran if ran.count(i) > 1})}"
    # Each id answered 202 once (its run) and as a replay once.
    assert sum(r.json().get("replayed") is True for r in answers) == 60


def test_any_server_answers_renews_and_terminates_a_rollout_another_runs_and_a_killed_runner_is_interrupted_within_the_bound(  # noqa: E501
        tmp_path, servers, api_key):
    a, b = servers(2)
    with httpx.Client(timeout=30, headers={"X-API-Key": api_key}) as c:
        on_a = f"{a}/containers/rollouts"
        assert c.post(on_a, json={**body("held", sleep=60), "lease_ttl_seconds": 3}
                      ).status_code == 202
        assert c.post(on_a, json=body("stopped", sleep=60)).status_code == 202
        assert c.post(on_a, json=body("orphan", sleep=60)).status_code == 202
        on_b = f"{b}/containers/rollouts"
        # Held through B alone, past its 3-s lease and past RUNNER_LOST_S: A lives, so
        # it runs on, never `interrupted`.
        until = time.monotonic() + RUNNER_LOST_S + 2
        while time.monotonic() < until:
            assert c.get(f"{on_b}/held").json()["status"] == "running"
            time.sleep(0.5)
        renewed = c.post(f"{on_b}/held/renew", json={"ttl_seconds": 120}).json()
        assert renewed["status"] == "running" and renewed["lease"]["ttl_seconds"] == 120
        # A terminate on B reaches A within its tick.
        c.post(f"{on_b}/stopped/terminate")
        asked = time.monotonic()
        while (doc := c.get(f"{on_b}/stopped").json())["status"] == "running":
            assert time.monotonic() - asked < 4 * TICK_S + 2, doc
            time.sleep(0.1)
        assert doc["status"] == "cancelled" and doc["error"]["code"] == "terminated"
        events = c.get(f"{on_b}/stopped/events").json()
        assert [e["kind"] for e in events["events"]] == ["rollout.accepted",
                                                         "rollout.cancelled"]
        # A killed outright: B says interrupted within the bound (and not before A's last
        # beat could have been its last).
        servers.procs[0].send_signal(signal.SIGKILL)
        servers.procs[0].wait(10)
        killed = time.monotonic()
        while (doc := c.get(f"{on_b}/orphan").json())["status"] == "running":
            assert time.monotonic() - killed < RUNNER_LOST_S + 2 * TICK_S + 2, doc
            time.sleep(0.2)
        assert doc["status"] == "interrupted"
        assert time.monotonic() - killed > RUNNER_LOST_S - 2 * TICK_S
    ran = runs(tmp_path)
    assert sorted(ran) == ["held", "orphan", "stopped"]


def test_two_apps_on_one_trace_file_never_answer_each_others_ids(tmp_path, serve, api_key):
    async def named(request: RolloutRequest, ctx: RolloutContext) -> dict:
        return {"run_id": request.run_id, "metrics": {"outcome_reward": 0.5}}

    with open_trace_store(str(tmp_path / "t.db")) as store:
        math, rel = (serve(create_app(toy_config(named, app_id=app_id), api_keys=[api_key],
                                      trace_store=store, rollout_records=RolloutRecords(store)))
                     for app_id in ("math", "relapp"))
        with httpx.Client(timeout=30, headers={"X-API-Key": api_key}) as c:
            first = c.post(math.url + "/containers/rollouts", json=body("same-id", sleep=0))
            only_math = c.post(math.url + "/containers/rollouts", json=body("math-only"))
            on_rel = c.post(rel.url + "/containers/rollouts",
                            json=body("same-id", sleep=0, other=True))
            for app in (math, rel):
                while c.get(f"{app.url}/containers/rollouts/same-id").json()[
                        "status"] == "running":
                    time.sleep(0.05)
            done = {app_id: c.get(f"{app.url}/containers/rollouts/same-id").json()
                    for app_id, app in (("math", math), ("relapp", rel))}
            unknown = c.get(rel.url + "/containers/rollouts/math-only")
    assert first.status_code == on_rel.status_code == only_math.status_code == 202
    assert "replayed" not in on_rel.json()  # another app's id: a rollout of its own
    assert done["math"]["task_id"] == "math" and done["relapp"]["task_id"] == "relapp"
    assert unknown.status_code == 404


def test_a_stream_on_another_server_follows_the_rollout_to_its_end(tmp_path, serve, api_key):
    async def slow(request: RolloutRequest, ctx: RolloutContext) -> dict:
        await asyncio.sleep(1.5)
        return {"run_id": request.run_id, "metrics": {"outcome_reward": 1.0}}

    with open_trace_store(str(tmp_path / "t.db")) as store:
        a, b = (serve(create_app(toy_config(slow), api_keys=[api_key], trace_store=store,
                                 rollout_records=RolloutRecords(store))) for _ in range(2))
        with httpx.Client(timeout=30, headers={"X-API-Key": api_key}) as c:
            assert c.post(a.url + "/containers/rollouts", json=body("streamed")
                          ).status_code == 202
            with c.stream("GET", b.url + "/containers/rollouts/streamed/stream") as stream:
                lines = [line for line in stream.iter_lines() if line.startswith("event:")]
    assert lines == ["event: rollout.accepted", "event: rollout.completed"]


async def long_episode(request: RolloutRequest, ctx: RolloutContext) -> dict:
    """A policy call a turn, each sending the conversation so far with its prompt's token
    ids (the turn before's and more), as `call_policy` records them."""
    messages = [{"role": "system", "content": "Walk on."}]
    prompt: list[int] = []
    for turn in range(request.env.config["turns"]):
        ctx.tracer.start_timestep(f"turn-{turn}", turn_number=turn)
        messages.append({"role": "user", "content": f"You are at cell {turn}. " * 6})
        prompt = [*prompt, *range(turn * 40, turn * 40 + 40)]
        event = ctx.tracer.record_lm_call(model_name="m", tokens=TurnTokens(
            prompt_ids=prompt, completion_ids=[7, 8, 9],
            completion_logprobs=[-0.1234567891234, -0.5, -1.0 / 3]))
        reply = {"role": "assistant", "content": f"I walk {turn}."}
        ctx.tracer.record_exchange(event, json.dumps({"model": "m", "messages": messages})
                                   .encode(), json.dumps({"choices": [{"message": reply}]})
                                   .encode())
        messages = [*messages, reply]
    return {"run_id": request.run_id, "metrics": {"outcome_reward": 1.0}}


def finished_long_episode(client: httpx.Client, url: str, rollout_id: str, turns: int) -> dict:
    """A `long_episode` of ``turns`` submitted asking for its trace: its document once it
    has finished, checked whole."""
    submitted = {**body(rollout_id, turns=turns), "record": {"return_trace": True}}
    assert client.post(url + "/containers/rollouts", json=submitted).status_code == 202
    while (doc := client.get(f"{url}/containers/rollouts/{rollout_id}").json())[
            "status"] == "running":
        time.sleep(0.05)
    assert doc["status"] == "completed", doc
    assert len(doc["trace"]["session_time_steps"]) == turns
    assert doc["turns"][-1]["prompt_token_ids"] == list(range(turns * 40))
    return doc


def test_a_long_episodes_record_grows_with_its_turns_and_reads_back_whole_elsewhere(
        tmp_path, serve, api_key):
    # Its trace and token turns, returned whole, grow with the square of the turns: the
    # record another server reads keeps each list as what it adds to the one before.
    db = tmp_path / "t.db"
    with open_trace_store(str(db)) as store:
        a, b = (serve(create_app(toy_config(long_episode), api_keys=[api_key],
                                 trace_store=store, rollout_records=RolloutRecords(store)))
                for _ in range(2))
        with httpx.Client(timeout=60, headers={"X-API-Key": api_key}) as c:
            documents = {}
            for turns in (10, 40):
                doc = finished_long_episode(c, a.url, f"walk-{turns}", turns)
                elsewhere = c.get(f"{b.url}/containers/rollouts/walk-{turns}").json()
                assert elsewhere == doc  # read from the record, not from a's memory
                documents[turns] = len(json.dumps(doc))
    with sqlite3.connect(db) as conn:
        stored = dict(conn.execute("SELECT rollout_id, length(result) FROM async_rollouts"))
    whole = documents[40] / 40 / (documents[10] / 10)
    kept = stored["walk-40"] / 40 / (stored["walk-10"] / 10)
    assert whole > 2.5  # what the contract answers: the square of the turns
    assert kept < 1.3, (stored, documents)


def test_a_finished_long_episode_is_kept_in_memory_at_the_size_of_its_record(
        serve, api_key):
    # A finished rollout is answered from memory for minutes (up to FINISHED_KEPT of them).
    # Its trace and token turns, whole, grow with the square of its turns: kept whole, a
    # server running hundreds of long episodes would run out of memory. Kept as its record
    # is, it holds a small part of what it answers, and reads back whole.
    server = serve(create_app(toy_config(long_episode), api_keys=[api_key]))
    turns, episodes = 60, 3
    with httpx.Client(timeout=60, headers={"X-API-Key": api_key}) as c:
        def played(rollout_id: str) -> int:
            return len(json.dumps(finished_long_episode(c, server.url, rollout_id, turns)))

        played("warm-up")  # the server's own first-use allocations
        tracemalloc.start()
        try:
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            answered = sum(played(f"walk-{n}") for n in range(episodes))
            gc.collect()
            kept = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        again = c.get(f"{server.url}/containers/rollouts/walk-0").json()  # still from memory
    assert again["turns"][-1]["prompt_token_ids"] == list(range(turns * 40))
    assert kept < 0.35 * answered, (kept, answered)
