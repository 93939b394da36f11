"""A loop nobody blocks unseen: `/health` latency while CPU-bound rollouts run, three ways.

The same CPU work (a pure-Python loop of ``--work-s`` seconds a step, ``--steps`` steps a
rollout) runs in an app served by `synth-deploy serve`:

  async    in an ``async def`` rollout, on the event loop: the kit must name the function
           in a warning, with the fix
  def      in a plain ``def`` rollout (on a worker thread: it shares the interpreter lock)
  worker   in a worker process (``worker_object``), the fix the warning names

While ``--rollouts`` of them run, a client asks ``/health`` every 10 ms; the bench prints
its p50/p99 against the same server idle (in the same run), and whether the kit's warning
named the function. Target (issue 37): the warning is there for "async", and /health p99 is
<= 20 ms with the fix.

    python bench/blocked_loop.py [--rollouts 4] [--steps 10] [--work-s 0.05]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from _harness import free_port

KEY = "sk_env_bench_0123456789abcdef0123"

WORK = '''
import time


def burn(seconds):
    """Pure-Python work, as an environment's step is."""
    end, n = time.perf_counter() + seconds, 0
    while time.perf_counter() < end:
        n += 1
    return n


class Burner:
    def step(self, seconds):
        return burn(seconds)
'''

APPS = {
    "async": '''
from synth_deploy.taskapp import TaskApp
from work import burn

task_app = TaskApp("bench-async", name="async", description="CPU work on the loop")


@task_app.rollout
async def rollout(request, ctx):
    for _ in range(%(steps)d):
        burn(%(work_s)r)
    return {"run_id": request.run_id, "metrics": {"episode_rewards": [1.0]}}
''',
    "def": '''
from synth_deploy.taskapp import TaskApp
from work import burn

task_app = TaskApp("bench-def", name="def", description="CPU work on a thread")


@task_app.rollout
def rollout(request, ctx):
    for _ in range(%(steps)d):
        burn(%(work_s)r)
    return {"run_id": request.run_id, "metrics": {"episode_rewards": [1.0]}}
''',
    "worker": '''
from synth_deploy.taskapp import TaskApp, worker_object
from work import Burner

task_app = TaskApp("bench-worker", name="worker", description="CPU work in a worker process")


@task_app.rollout
async def rollout(request, ctx):
    async with worker_object(Burner) as burner:
        for _ in range(%(steps)d):
            await burner.step(%(work_s)r)
    return {"run_id": request.run_id, "metrics": {"episode_rewards": [1.0]}}
''',
}


def _body(i: int) -> dict:
    return {"run_id": f"b{i}", "env": {"seed": 1, "config": {}}, "mode": "rl",
            "policy": {"policy_name": "p", "config": {
                "model": "m", "inference_url": "http://127.0.0.1:1/v1"}}}


async def _health_while(url: str, rollouts: int, seconds: float | None) -> list[float]:
    """/health latencies (ms) every 10 ms, while ``rollouts`` rollouts run back to back (or
    for ``seconds`` idle when ``rollouts`` is 0)."""
    headers = {"X-API-Key": KEY}
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:
        done = asyncio.Event()

        async def run() -> None:
            if rollouts:
                await asyncio.gather(*(client.post("/rollout", json=_body(i))
                                       for i in range(rollouts)))
            else:
                await asyncio.sleep(seconds or 1.0)
            done.set()

        runner = asyncio.ensure_future(run())
        while not done.is_set():
            started = time.perf_counter()
            await client.get("/health")
            latencies.append((time.perf_counter() - started) * 1000)
            await asyncio.sleep(0.01)
        await runner
    return latencies


def _p(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--work-s", type=float, default=0.05)
    args = parser.parse_args()
    print(f"{args.rollouts} rollouts at once, each {args.steps} steps of {args.work_s:g}s of "
          "CPU; /health every 10 ms")
    print(f"{'rollout':>8} {'idle p99':>9} {'busy p50':>9} {'busy p99':>9}  warning")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "work.py").write_text(WORK)
        for name, source in APPS.items():
            app = folder / f"{name}_app.py"
            app.write_text(source % {"steps": args.steps, "work_s": args.work_s})
            port = free_port()
            log = folder / f"{name}.log"
            with log.open("w") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "synth_deploy.cli", "serve", str(app), "--port",
                     str(port), "--no-trace"], stdout=out, stderr=subprocess.STDOUT,
                    env={**os.environ, "ENVIRONMENT_API_KEY": KEY}, cwd=tmp)
            url = f"http://127.0.0.1:{port}"
            try:
                for _ in range(300):
                    try:
                        httpx.get(url + "/", timeout=1)
                        break
                    except httpx.HTTPError:
                        time.sleep(0.05)
                asyncio.run(_health_while(url, args.rollouts, None))  # warm: workers started
                idle = asyncio.run(_health_while(url, 0, 2.0))
                busy = asyncio.run(_health_while(url, args.rollouts, None))
            finally:
                proc.terminate()
                proc.wait(15)
            said = [json.dumps(line.strip()) for line in log.read_text().splitlines()
                    if "held the event loop" in line]
            warning = f"yes: {said[0][:90]}..." if said else "none"
            print(f"{name:>8} {_p(idle, 99):>8.1f}ms {_p(busy, 50):>8.1f}ms "
                  f"{_p(busy, 99):>8.1f}ms  {warning}")


if __name__ == "__main__":
    main()
