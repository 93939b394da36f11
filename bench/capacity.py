"""Capacity: thousands of LLM-bound rollouts in flight on one core.

A real RL run keeps hundreds to thousands of episodes in flight, each waiting on a policy for
a long while. Here each rollout sleeps ``--rollout-s`` (10 s) and N of them are sent at once
(N = 1k, 2k, 4k, 8k), each on its own connection as a trainer's client pool opens them, the
openings spread over the first second. Three servers, each pinned to core 0 with whatever it
starts (the load client runs on the other core):

  traced `synth-deploy serve APP` as users run it: every rollout committed to a SQLite file
         before its answer, by the writer child, which shares the server's core
  serve  the same with `--no-trace`
  bare   a Starlette endpoint doing the same sleep, on uvicorn's fast path

For each N: rollouts answered 200, errors (any other status, or a dropped connection), and
p50/p99 of the time a rollout took; for traced, the sessions in its file (one per 200).
Target (issue 37): serve holds 4,000 with 0 errors and p99 <= 10.5 s.

Then the crowd: 2,000 clients without a key hammer the kit (each sends a request, reads its
401, connects again) while a keyed client keeps 256 rollouts in flight. Target: the keyed
client sees 0 x 503.

    python bench/capacity.py [--levels 1000,2000,4000,8000] [--rollout-s 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from _harness import child_server, latency_summary, post_rollout
from server_overhead import BARE_SERVER, KEY, SERVE_CLI

PIN = ["taskset", "-c", "0"]

SLEEPY_APP = '''
import asyncio
from synth_deploy.taskapp import TaskApp

task_app = TaskApp("bench-sleepy", name="sleepy", description="waits like an LLM-bound episode")


@task_app.rollout
async def rollout(request, ctx):
    await asyncio.sleep(%(seconds)r)
    return {"run_id": request.run_id, "metrics": {"episode_rewards": [1.0], "num_steps": 1}}
'''

def rollout_body(run_id: str) -> bytes:
    """A rollout request whose policy is never called (the apps here do not call it)."""
    return json.dumps({"run_id": run_id, "env": {"seed": 1, "config": {}},
                       "policy": {"policy_name": "p", "config": {
                           "model": "m", "inference_url": "http://127.0.0.1:1/v1"}},
                       "mode": "rl"}).encode()


async def _level(url: str, n: int) -> list[tuple[int | str, float]]:
    return await asyncio.gather(*(post_rollout(url, rollout_body(f"cap-{n}-{i}"), KEY,
                                               delay=i / n) for i in range(n)))


def _sessions_in(db: Path) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT count(*) FROM session_traces").fetchone()[0]


async def _crowd(url: str, keyless: int, keyed: int, seconds: float
                 ) -> tuple[dict[str, object], int]:
    """``keyless`` clients hammering without a key while ``keyed`` rollouts stay in flight
    for ``seconds``: the keyed results, and how many keyless requests were answered."""
    stop_at = time.monotonic() + seconds
    keyless_answers = [0]

    async def hammer(i: int) -> None:
        await asyncio.sleep(i / keyless)
        while time.monotonic() < stop_at:
            status, _ = await post_rollout(url, rollout_body("keyless"), None)
            keyless_answers[0] += 1
            if status != 401:
                await asyncio.sleep(0.1)

    async def keyed_slot(i: int) -> list[tuple[int | str, float]]:
        await asyncio.sleep(i / keyed)
        done = []
        while time.monotonic() < stop_at:
            done.append(await post_rollout(url, rollout_body(f"keyed-{i}"), KEY))
        return done

    hammers = [asyncio.ensure_future(hammer(i)) for i in range(keyless)]
    slots = await asyncio.gather(*(keyed_slot(i) for i in range(keyed)))
    await asyncio.gather(*hammers)
    return latency_summary([r for slot in slots for r in slot]), keyless_answers[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1000,2000,4000,8000")
    parser.add_argument("--rollout-s", type=float, default=10.0)
    parser.add_argument("--crowd-s", type=float, default=25.0)
    args = parser.parse_args()
    levels = [int(n) for n in args.levels.split(",")]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    os.sched_setaffinity(0, {1})  # the load client on core 1, the servers on core 0
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass

    print(f"N concurrent rollouts of {args.rollout_s:g}s, each server pinned to core 0 "
          f"(open files: {hard})")
    print(f"{'N':>6} {'server':>7} {'ok':>6} {'errors':>22} {'p50 s':>7} {'p99 s':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        app = Path(tmp) / "sleepy.py"
        app.write_text(SLEEPY_APP % {"seconds": args.rollout_s})
        for n in levels:
            db = Path(tmp) / f"traces-{n}.db"
            for name, source, flags in (("traced", SERVE_CLI, ["--trace-db", str(db)]),
                                        ("serve", SERVE_CLI, ["--no-trace"]),
                                        ("bare", BARE_SERVER, [])):
                with child_server(source, wrapper=PIN, quiet=True, app=str(app), key=KEY,
                                  flags=flags,
                                  work=f"await asyncio.sleep({args.rollout_s!r})") as url:
                    found = latency_summary(asyncio.run(_level(url, n)))
                errors = ", ".join(f"{v}x {k}" for k, v in found["errors"].items()) or "0"
                stored = f"  {_sessions_in(db)} sessions stored" if name == "traced" else ""
                print(f"{n:>6} {name:>7} {found['ok']:>6} {errors:>22} {found['p50']:>7.2f} "
                      f"{found['p99']:>7.2f}{stored}", flush=True)
        with child_server(SERVE_CLI, wrapper=PIN, quiet=True, app=str(app), key=KEY,
                          flags=["--no-trace"]) as url:
            keyed, keyless = asyncio.run(_crowd(url, 2000, 256, args.crowd_s))
        refused = keyed["errors"].get("503", 0)
        print(f"\ncrowd: 2000 clients without a key ({keyless} requests answered) beside a "
              f"keyed client at 256 in flight for {args.crowd_s:g}s: keyed {keyed['ok']} "
              f"ok, {refused} x 503 (target 0), other errors {keyed['errors']}, p99 "
              f"{keyed['p99']:.2f}s")
    sys.exit(0)


if __name__ == "__main__":
    main()
