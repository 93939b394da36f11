"""Crafter under load: 16 concurrent 40-turn episodes through the mock policy, and /health
while they play.

Two identical crafter servers (`create_app`, tracing off) and the mock policy each run under
uvicorn in a child process. The episodes play on one server while both are probed for
/health every 10 ms: the twin that plays nothing is the baseline, probed at the same moments,
so a stall of the whole machine shows in both and only what the episodes cost shows in the
ratio. Then the same 16 episodes (the same actions, read back from the responses) are played
by the bare environment in a child process, with no server, policy or prompts: the
rollouts/s ratio is what the kit costs around the game. Both run twice: on fresh worlds
(each generated on first use, ~1.5 s of CPU for 64×64) and on the same seeds again (worlds
kept).

    python bench/crafter_rollouts.py [--episodes 16] [--turns 40]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from _harness import child_server

CRAFTER_DIR = Path(__file__).resolve().parents[1] / "apps" / "crafter"
KEY = "sk_env_bench_crafter_0000000000"

SERVE_CRAFTER = """
import uvicorn
from synth_deploy.serving import create_app
from synth_deploy.taskapp.registry import load_app
app = create_app(load_app("crafter").build_config(), api_keys=["%(key)s"])
uvicorn.run(app, host="127.0.0.1", port=%(port)d, log_level="warning", access_log=False)
"""

MOCK_POLICY = """
import uvicorn
from synth_deploy.runs import create_mock_policy_app
uvicorn.run(create_mock_policy_app(), host="127.0.0.1", port=%(port)d, log_level="warning",
            access_log=False)
"""

BARE_ENVIRONMENT = """
import json, sys, time
sys.path.insert(0, %(crafter_dir)r)
from crafter_world import Episode, tier_of_seed
games = json.load(sys.stdin)
seconds = []
for _ in range(2):  # fresh worlds, then the same worlds kept
    started = time.perf_counter()
    for seed, turns in games:
        episode = Episode(seed, tier_of_seed(seed))
        for actions in turns:
            episode.play(actions)
    seconds.append(time.perf_counter() - started)
print(json.dumps(seconds))
"""


def ms(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] * 1000


async def probe(client: httpx.AsyncClient, done: asyncio.Future) -> list[float]:
    """One /health every 10 ms (not waiting for the previous one) until ``done``."""
    latencies: list[float] = []

    async def one() -> None:
        t0 = time.perf_counter()
        (await client.get("/health")).raise_for_status()
        latencies.append(time.perf_counter() - t0)

    probes = []
    while not done.done():
        probes.append(asyncio.ensure_future(one()))
        await asyncio.sleep(0.01)
    await asyncio.gather(*probes)
    return latencies


async def play(busy_url: str, idle_url: str, policy_url: str, seeds: list[int], turns: int,
               label: str) -> tuple[float, list[dict], list[float], list[float]]:
    headers = {"X-API-Key": KEY}
    async with httpx.AsyncClient(base_url=busy_url, headers=headers, timeout=1800,
                                 limits=httpx.Limits(max_connections=64)) as busy, \
            httpx.AsyncClient(base_url=idle_url, headers=headers, timeout=60) as idle:
        async def one(seed: int) -> dict:
            resp = await busy.post("/rollout", json={
                "run_id": f"bench-{label}-{seed}",
                "env": {"seed": seed, "config": {"max_turns": turns}},
                "policy": {"config": {"model": "mock", "inference_url": policy_url}}})
            resp.raise_for_status()
            return resp.json()

        started = time.perf_counter()
        episodes = asyncio.ensure_future(asyncio.gather(*(one(s) for s in seeds)))
        busy_probes, idle_probes = await asyncio.gather(probe(busy, episodes),
                                                        probe(idle, episodes))
        return time.perf_counter() - started, await episodes, busy_probes, idle_probes


def bare_environment(seeds: list[int], results: list[dict]) -> list[float]:
    games = [[seed, [s["info"]["actions"] for s in r["trajectories"][0]["steps"]]]
             for seed, r in zip(seeds, results, strict=True)]
    out = subprocess.run([sys.executable, "-c", BARE_ENVIRONMENT % {
        "crafter_dir": str(CRAFTER_DIR)}], input=json.dumps(games), capture_output=True,
        text=True, timeout=1800, check=True)
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--turns", type=int, default=40)
    args = parser.parse_args()
    n, seeds = args.episodes, list(range(100, 100 + args.episodes))  # the three tiers, mixed
    with child_server(MOCK_POLICY) as policy, child_server(SERVE_CRAFTER, key=KEY) as app, \
            child_server(SERVE_CRAFTER, key=KEY) as twin:
        runs = {label: asyncio.run(play(app, twin, policy + "/v1", seeds, args.turns, label))
                for label in ("fresh", "kept")}
    results = runs["fresh"][1]
    bare = dict(zip(("fresh", "kept"), bare_environment(seeds, results), strict=True))
    played = sum(len(r["trajectories"][0]["steps"]) for r in results)
    print(f"crafter: {n} concurrent episodes of up to {args.turns} turns through the mock "
          f"policy ({played} turns played, "
          f"{statistics.mean(r['metrics']['outcome_reward'] for r in results):.2f} "
          "achievements each)")
    print(f"{'':24}{'fresh worlds':>14}{'kept worlds':>14}")
    print(f"{'kit rollouts/s':24}" + "".join(f"{n / runs[k][0]:14.3f}" for k in runs))
    print(f"{'bare env episodes/s':24}" + "".join(f"{n / bare[k]:14.3f}" for k in runs))
    print(f"{'ratio kit/bare':24}" + "".join(f"{bare[k] / runs[k][0]:13.2f}×" for k in runs))
    for q in (50, 99):
        print(f"{f'/health p{q} ms busy':24}" + "".join(f"{ms(runs[k][2], q):14.1f}"
                                                         for k in runs))
        print(f"{f'/health p{q} ms idle twin':24}" + "".join(f"{ms(runs[k][3], q):14.1f}"
                                                              for k in runs))
    print(f"{'ratio p99 busy/idle':24}" + "".join(
        f"{ms(runs[k][2], 99) / ms(runs[k][3], 99):13.2f}×" for k in runs))


if __name__ == "__main__":
    main()
