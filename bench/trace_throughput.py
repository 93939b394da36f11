"""Rollout throughput with tracing on vs off, in one run, and the SFT export rate.

    python bench/trace_throughput.py [--rollouts 400] [--concurrency 32] [--rounds 3]

Serves the math app twice on 127.0.0.1 (real uvicorn, the kit's mock policy), once without a
trace store and once writing every rollout to a fresh SQLite file, fires the same rollouts
at each (rounds alternate, so drift hits both equally) and prints rollouts/s and the ratio
(target: tracing on ≥ 0.5× off). Then exports the traced sessions as SFT JSONL.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from synth_deploy.runs import create_mock_policy_app
from synth_deploy.taskapp import BackgroundServer, create_app, load_app
from synth_deploy.tracing import export_sft, open_trace_store

KEY = "sk_env_bench"


async def fire(url: str, inference_url: str, n: int, concurrency: int, tag: str) -> float:
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=60.0, limits=httpx.Limits(
            max_connections=concurrency)) as client:
        async def one(i: int) -> None:
            body = {"run_id": f"{tag}-{i}", "env": {"seed": i % 100}, "mode": "eval",
                    "policy": {"config": {"model": "mock", "inference_url": inference_url}}}
            async with limit:
                resp = await client.post(url + "/rollout", json=body,
                                         headers={"X-API-Key": KEY})
                if resp.status_code != 200:
                    raise SystemExit(f"{url} answered {resp.status_code}: {resp.text[:400]}")

        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        return n / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    config = load_app("math").build_config()
    with tempfile.TemporaryDirectory() as tmp, \
            BackgroundServer(create_mock_policy_app()) as policy, \
            open_trace_store(str(Path(tmp) / "bench.db")) as store, \
            BackgroundServer(create_app(config, api_keys=[KEY])) as plain, \
            BackgroundServer(create_app(load_app("math").build_config(), api_keys=[KEY],
                                        trace_store=store)) as traced:
        inference = policy.url + "/v1"
        asyncio.run(fire(plain.url, inference, 50, args.concurrency, "warm-off"))
        asyncio.run(fire(traced.url, inference, 50, args.concurrency, "warm-on"))
        off, on = [], []
        for r in range(args.rounds):
            off.append(asyncio.run(fire(plain.url, inference, args.rollouts,
                                        args.concurrency, f"off{r}")))
            on.append(asyncio.run(fire(traced.url, inference, args.rollouts,
                                       args.concurrency, f"on{r}")))
        off_rate, on_rate = statistics.median(off), statistics.median(on)
        print(f"rollouts: {args.rollouts} × {args.rounds} rounds, concurrency "
              f"{args.concurrency}, math app + mock policy on 127.0.0.1")
        print(f"  tracing off : {off_rate:8.1f} rollouts/s   (rounds: "
              f"{', '.join(f'{x:.0f}' for x in off)})")
        print(f"  tracing on  : {on_rate:8.1f} rollouts/s   (rounds: "
              f"{', '.join(f'{x:.0f}' for x in on)})")
        print(f"  ratio on/off: {on_rate / off_rate:8.2f}×  (target ≥ 0.50×)")

        sessions = store.count_sessions()
        result = export_sft(store, Path(tmp) / "sft.jsonl")
        print(f"export: {result.examples} SFT examples from {result.sessions} of {sessions} "
              f"sessions in {result.seconds:.2f}s = {result.examples / result.seconds:.0f} "
              f"examples/s, {sessions / result.seconds:.0f} sessions/s")


if __name__ == "__main__":
    main()
