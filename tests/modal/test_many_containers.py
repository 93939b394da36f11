"""One deployment, many containers: an async rollout submitted to one container is answered
by any, a terminate or a renew anywhere reaches its runner, a killed container's rollouts
answer `interrupted` within the bound, and no id runs twice.

The multi-container stand-in (tests/standins/): `synth-deploy deploy` through the stand-in
`modal` CLI starts three processes running the real container entry (`web()`, the image's
files only), which share records in the Dict service (modal_dict.py, a process of its own,
Modal's documented Dict semantics); a round-robin router (Modal's balancer) sits behind the
strict Modal front end. The app, uvicorn, the kit's server and the CLI are the real ones.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from standins.cutoff_proxies import StrictModalFrontEnd
from standins.modal_helpers import COMMAND as STANDIN
from standins.round_robin import RoundRobinRouter
from typer.testing import CliRunner

from synth_deploy.cli import app as cli_app
from synth_deploy.serving.containers import retryable
from synth_deploy.tracing import RUNNER_LOST_S, TICK_S

ROLLOUTS = 300

APP = '''
import asyncio, os
from synth_deploy.modal import ModalSettings, modal_app
from synth_deploy.taskapp import TaskApp

task_app = TaskApp(%(app_id)r, name="Many", description="Waits, and says where it ran.",
                   modal=ModalSettings(name="synth-" + %(app_id)r,
                                       env={"RUNS_FILE": %(runs)r}))


@task_app.rollout
async def rollout(request, ctx):
    with open(os.environ["RUNS_FILE"], "a") as runs:
        runs.write(f"{request.run_id} {os.environ.get('MODAL_TASK_ID', 'local')}\\n")
    await asyncio.sleep(float(request.env.config.get("sleep", 0.05)))
    return {"run_id": request.run_id, "metrics": {"outcome_reward": 1.0}}


app = modal_app(__file__)
'''


def _body(rollout_id: str, sleep: float) -> dict:
    return {"rollout_id": rollout_id, "seed": 1, "submission_mode": "async",
            "env": {"config": {"sleep": sleep}},
            "policy": {"model": "m", "inference_url": "http://127.0.0.1:9/v1"}}


def _deploy(tmp_path: Path, monkeypatch, containers: int) -> tuple[list[dict], Path]:
    runs = tmp_path / "runs"
    app_file = tmp_path / "many" / "task_app.py"
    app_file.parent.mkdir()
    # An id of its own: the tests of one process share its registry of apps.
    app_file.write_text(APP % {"runs": str(runs), "app_id": f"many-{containers}"})
    monkeypatch.setenv("STANDIN_MODAL_CONTAINERS", str(containers))
    deployed = CliRunner().invoke(cli_app, ["deploy", str(app_file), "--no-check",
                                            "--modal-cli", STANDIN], catch_exceptions=False)
    assert deployed.exit_code == 0, deployed.output
    state = Path(os.environ["STANDIN_MODAL_STATE_DIR"])
    started = [json.loads(line) for line in (state / "containers.jsonl").read_text()
               .splitlines()]
    assert len(started) == containers
    runs.write_text("")  # the deploy's own local validation ran one rollout here
    return started, runs


def _ran(runs: Path) -> list[tuple[str, str]]:
    return [tuple(line.split()) for line in runs.read_text().splitlines()]


@pytest.mark.slow
def test_three_containers_300_rollouts_polled_anywhere_one_killed(standin, monkeypatch,
                                                                  tmp_path):
    containers, runs = _deploy(tmp_path, monkeypatch, 3)
    key = standin["key"]
    rng = random.Random(64)
    sleeps = {f"many-{i}": rng.uniform(2.0, 8.0) for i in range(ROLLOUTS)}
    killed: dict = {}  # the container SIGKILLed, chosen mid-run
    with RoundRobinRouter([c["url"] for c in containers]) as router, \
            StrictModalFrontEnd(router.url) as front:

        async def scenario() -> tuple[dict[str, dict], dict[str, float], float]:
            gate = asyncio.Semaphore(48)
            seen: dict[str, dict] = {}
            ended_at: dict[str, float] = {}
            killed_at: list[float] = []
            submitted = asyncio.Event()
            count = [0]

            async def one(c: httpx.AsyncClient, rollout_id: str) -> None:
                async with gate:
                    answer = await c.post("/containers/rollouts",
                                          json=_body(rollout_id, sleeps[rollout_id]))
                assert answer.status_code == 202, answer.text
                count[0] += 1
                if count[0] == ROLLOUTS:
                    submitted.set()
                while True:
                    await asyncio.sleep(1.0)
                    async with gate:  # through the router: mostly another container
                        polled = await c.get(f"/containers/rollouts/{rollout_id}")
                    if retryable(polled.status_code):  # as the kit's clients: asked again
                        continue
                    doc = polled.json()
                    if doc["status"] != "running":
                        seen[rollout_id], ended_at[rollout_id] = doc, time.monotonic()
                        return

            async def kill() -> None:
                await submitted.wait()
                async with httpx.AsyncClient(timeout=10, headers={"X-API-Key": key}) as probe:
                    running = [(await probe.get(c["url"] + "/health")).json()["rollouts"][
                        "in_flight"] for c in containers]
                # Mid-run: the one running the most (round robin spreads requests, not
                # submissions: a cadence of polls can leave one with none running).
                killed.update(containers[running.index(max(running))])
                assert max(running) > 0, running
                os.kill(killed["pid"], signal.SIGKILL)
                killed_at.append(time.monotonic())
                killed_wall.append(time.time())

            async with httpx.AsyncClient(base_url=front.url, timeout=60,
                                         headers={"X-API-Key": key}) as c:
                await asyncio.wait_for(asyncio.gather(kill(), *(
                    one(c, rollout_id) for rollout_id in sleeps)), 180)
            return seen, ended_at, killed_at[0]

        killed_wall: list[float] = []
        seen, ended_at, killed_at = asyncio.run(scenario())
        killed_wall = killed_wall[0]
        sent = list(router.sent)
    ran = _ran(runs)
    ids = [rollout_id for rollout_id, _ in ran]
    assert sorted(ids) == sorted(sleeps), "an id ran twice, or never"
    on_killed = {rollout_id for rollout_id, task in ran if task == killed["task_id"]}
    assert on_killed, "the killed container ran none of them"
    statuses = {rollout_id: doc["status"] for rollout_id, doc in seen.items()}
    assert set(statuses) == set(sleeps)  # every id reached a terminal state
    interrupted = 0
    for rollout_id, status in statuses.items():
        doc = seen[rollout_id]
        if rollout_id in on_killed and status == "interrupted":
            # Cut mid-run: answered interrupted, by another container, within the bound.
            interrupted += 1
            assert ended_at[rollout_id] - killed_at < RUNNER_LOST_S + 2 * TICK_S + 1.5
        else:  # run elsewhere, or finished on the killed one before it died
            assert status == "completed", (rollout_id, doc)
            if rollout_id in on_killed:
                assert datetime.fromisoformat(doc["updated_at"]).timestamp() < killed_wall
    assert interrupted  # the kill came mid-run for some
    assert min(sent) > ROLLOUTS / 2  # every container answered many of the polls


def test_60_ids_submitted_at_once_to_two_containers_each_run_once_and_asks_reach_the_runner(
        standin, monkeypatch, tmp_path):
    containers, runs = _deploy(tmp_path, monkeypatch, 2)
    key = standin["key"]
    a, b = (c["url"] + "/containers/rollouts" for c in containers)
    ids = [f"both-{i}" for i in range(60)]

    async def submit_everywhere() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30, headers={"X-API-Key": key}) as c:
            return await asyncio.gather(*(c.post(url, json=_body(i, 0.2))
                                          for i in ids for url in (a, b)))

    answers = asyncio.run(submit_everywhere())
    assert {r.status_code for r in answers} <= {200, 202}, {r.text for r in answers}
    with httpx.Client(timeout=30, headers={"X-API-Key": key}) as c:
        deadline = time.monotonic() + 30
        for rollout_id in ids:
            while (doc := c.get(f"{a}/{rollout_id}").json())["status"] == "running":
                assert time.monotonic() < deadline, doc
                time.sleep(0.05)
            assert doc["status"] == "completed"
        assert sorted(i for i, _ in _ran(runs)) == sorted(ids)
        # A long one on A: held and renewed through B, terminated through B.
        assert c.post(a, json={**_body("held", 60), "lease_ttl_seconds": 2}).status_code == 202
        until = time.monotonic() + 4  # past its 2-s lease, read through B only
        while time.monotonic() < until:
            assert c.get(f"{b}/held").json()["status"] == "running"
            time.sleep(0.4)
        renewed = c.post(f"{b}/held/renew", json={"ttl_seconds": 30}).json()
        assert renewed["lease"]["ttl_seconds"] == 30
        c.post(f"{b}/held/terminate")
        asked = time.monotonic()
        while (doc := c.get(f"{b}/held").json())["status"] == "running":
            assert time.monotonic() - asked < 4 * TICK_S + 2, doc
            time.sleep(0.1)
    assert doc["status"] == "cancelled" and doc["error"]["code"] == "terminated"
