"""Server overhead: a trivial rollout through `create_app` vs a bare Starlette endpoint.

Both servers run under uvicorn in their own child processes and do the same JSON work (check
the key header, parse the request, answer a RolloutResponse-shaped body). They are loaded in
alternating rounds within one run, so machine noise hits both; the script prints throughput
and p99 ratios (kit / bare). Targets: throughput ≥ 0.8×, p99 ≤ 2×.

    python bench/server_overhead.py [--seconds 3] [--rounds 5] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import httpx

KEY = "bench-key"

KIT_SERVER = """
import uvicorn
from synth_deploy.taskapp import TaskAppConfig, TaskDescriptor, TaskInfo, create_app

async def rollout(request, ctx):
    return {"run_id": request.run_id, "metrics": {"episode_rewards": [1.0], "num_steps": 1}}

config = TaskAppConfig(app_id="bench", name="bench", description="bench",
                       base_task_info=TaskInfo(task=TaskDescriptor(id="bench", name="bench")),
                       provide_task_instances=lambda seeds: [], rollout=rollout)
uvicorn.run(create_app(config, api_keys=["%(key)s"]), host="127.0.0.1", port=%(port)d,
            log_level="warning", access_log=False)
"""

BARE_SERVER = """
import hmac, json, uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

async def rollout(request):
    if not hmac.compare_digest(request.headers.get("x-api-key", "").encode(), b"%(key)s"):
        return JSONResponse({"detail": "forbidden"}, 403)
    body = json.loads(await request.body())
    rewards = [1.0]
    return JSONResponse({"run_id": body["run_id"], "metrics": {
        "episode_rewards": rewards, "reward_mean": 1.0, "episode_returns": rewards,
        "mean_return": 1.0, "num_steps": 1, "num_episodes": 1, "outcome_reward": None,
        "event_rewards": None, "outcome_score": None, "events_score": None, "details": {}},
        "trajectories": [], "branches": {}, "aborted": False, "trace": None,
        "trace_correlation_id": None, "inference_url": None, "pipeline_metadata": {}})

uvicorn.run(Starlette(routes=[Route("/rollout", rollout, methods=["POST"])]), host="127.0.0.1",
            port=%(port)d, log_level="warning", access_log=False)
"""

BODY = {"run_id": "bench", "env": {"seed": 1, "config": {}}, "policy": {"policy_name": "p",
        "config": {"model": "m", "inference_url": "http://127.0.0.1:1/v1"}},
        "record": {"return_trace": False}, "mode": "rl", "safety": {"max_time_s": 60}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(source: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", source % {"key": KEY, "port": port}],
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            httpx.post(url + "/rollout", json=BODY, headers={"X-API-Key": KEY}, timeout=1)
            return proc, url
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"server on {url} did not start")


async def load(url: str, seconds: float, concurrency: int) -> tuple[float, float]:
    """Requests/second and p99 latency (ms) under ``concurrency`` closed-loop clients.

    A raw keep-alive HTTP/1.1 client on asyncio streams: httpx would be the bottleneck and
    hide the servers' difference.
    """
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(BODY).encode()
    request = (f"POST /rollout HTTP/1.1\r\nHost: {host}\r\nX-API-Key: {KEY}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
               ).encode() + payload
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds

    async def worker() -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                status = head.split(b" ", 2)[1]
                length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                body = await reader.readexactly(length)
                if status != b"200":
                    raise SystemExit(f"{url} answered {status.decode()}: {body[:200]!r}")
                latencies.append(time.perf_counter() - t0)
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    p99 = statistics.quantiles(latencies, n=100)[98] * 1000
    return len(latencies) / elapsed, p99


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()

    kit, kit_url = start(KIT_SERVER)
    bare, bare_url = start(BARE_SERVER)
    try:
        results: dict[str, list[tuple[float, float]]] = {"kit": [], "bare": []}
        for round_no in range(args.rounds):
            order = [("kit", kit_url), ("bare", bare_url)]
            for name, url in order if round_no % 2 == 0 else reversed(order):
                asyncio.run(load(url, 0.5, args.concurrency))  # warm up connections
                results[name].append(asyncio.run(load(url, args.seconds, args.concurrency)))
        print(f"{'round':>5} {'kit req/s':>10} {'bare req/s':>10} {'kit p99 ms':>11} "
              f"{'bare p99 ms':>11}")
        for i, ((kr, kp), (br, bp)) in enumerate(zip(results["kit"], results["bare"],
                                                     strict=True)):
            print(f"{i + 1:>5} {kr:>10.0f} {br:>10.0f} {kp:>11.2f} {bp:>11.2f}")
        # Ratios are paired within a round (back to back), then the median taken: a noisy
        # neighbour slows one round of both servers, not one server of every round.
        pairs = list(zip(results["kit"], results["bare"], strict=True))
        rps_ratio = statistics.median(k[0] / b[0] for k, b in pairs)
        p99_ratio = statistics.median(k[1] / b[1] for k, b in pairs)
        print(f"throughput ratio (kit/bare): {rps_ratio:.2f}x   target >= 0.80x  "
              f"(median of {len(pairs)} paired rounds)")
        print(f"p99 latency ratio (kit/bare): {p99_ratio:.2f}x   target <= 2.00x")
    finally:
        for proc in (kit, bare):
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
