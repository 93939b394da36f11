"""Memory held by finished async rollouts: the server's RSS after 1,000 finished async
rollouts, then after 10,000 (each body ~20 KB, each rollout answered at once), printed as
the ratio of the two. Finished rollouts are kept in memory up to a cap and an age
(`FINISHED_KEPT`, `FINISHED_KEPT_S`): past them the ratio stays near 1.

The server is `synth-deploy serve APP --no-trace` as users run it (records in memory only,
the case that held every finished rollout before the cap); the client submits in waves of
100 on keep-alive connections and waits for each wave to finish.

    python bench/async_memory.py [--first 1000] [--then 10000] [--body-kb 20] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

import httpx
from _harness import child_server, server_pid
from server_overhead import KEY, SERVE_CLI

INSTANT_APP = '''
from synth_deploy.taskapp import TaskApp

task_app = TaskApp("bench-instant", name="instant", description="answers at once")


@task_app.rollout
async def rollout(request, ctx):
    return {"run_id": request.run_id, "metrics": {"episode_rewards": [1.0], "num_steps": 1}}
'''
WAVE = 100


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise SystemExit(f"no VmRSS for process {pid}")


def _body(rollout_id: str, padding: str) -> dict:
    return {"rollout_id": rollout_id, "seed": 1, "submission_mode": "async",
            "env": {"config": {"padding": padding}},
            "policy": {"model": "m", "inference_url": "http://127.0.0.1:1/v1"}}


async def _finish(url: str, start: int, stop: int, padding: str) -> int:
    """Submit rollouts ``start``..``stop`` in waves, each waited for; the errors seen."""
    errors = 0
    async with httpx.AsyncClient(base_url=url + "/containers", timeout=60,
                                 headers={"X-API-Key": KEY}) as c:
        for wave in range(start, stop, WAVE):
            ids = [f"mem-{i}" for i in range(wave, min(stop, wave + WAVE))]
            answers = await asyncio.gather(*(c.post("/rollouts", json=_body(i, padding))
                                             for i in ids))
            errors += sum(a.status_code != 202 for a in answers)
            for rollout_id in ids:
                doc = (await c.get(f"/rollouts/{rollout_id}", params={"wait_ms": 5000})).json()
                errors += doc.get("status") != "completed"
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--first", type=int, default=1_000)
    parser.add_argument("--then", type=int, default=10_000)
    parser.add_argument("--body-kb", type=int, default=20)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    padding = "x" * (args.body_kb * 1024)
    with tempfile.TemporaryDirectory() as tmp:
        app = Path(tmp) / "app.py"
        app.write_text(INSTANT_APP)
        print(f"{'run':>4} {'RSS@' + str(args.first):>10} {'RSS@' + str(args.then):>11} "
              f"{'ratio':>6} {'errors':>6}")
        for run in range(1, args.runs + 1):
            with child_server(SERVE_CLI, ready_path="/health", quiet=True, app=str(app),
                              key=KEY, flags=["--no-trace"]) as url:
                pid = server_pid(url)
                assert pid is not None
                errors = asyncio.run(_finish(url, 0, args.first, padding))
                first = _rss_mib(pid)
                errors += asyncio.run(_finish(url, args.first, args.then, padding))
                then = _rss_mib(pid)
            print(f"{run:>4} {first:>9.1f}M {then:>10.1f}M {then / first:>6.2f} {errors:>6}")
    print(json.dumps({"note": "ratio: RSS after --then finished rollouts / after --first"}))


if __name__ == "__main__":
    main()
