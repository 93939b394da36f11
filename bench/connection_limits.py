"""Connection limits: what the request deadlines and the connection cap cost a served app.

The same trivial task app is served twice, each in its own child process: through
`LocalRunner.serve_forever()` (what `synth-deploy serve` runs: uvicorn with the kit's bounded
HTTP/1.1 protocol, see synth_deploy/serving/_connections.py) and through plain
`uvicorn.run` on the same ASGI app (the baseline). Both are loaded in alternating rounds; the
script prints throughput and p99 ratios (bounded / plain), and the ratio of server CPU time
per request, read from /proc for each server process (which other load on the machine does
not skew). Targets: throughput >= 0.95x, CPU per request <= 1.05x.

    python bench/connection_limits.py [--seconds 3] [--rounds 5] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from _harness import LoadResult, fixed_body, free_port, load, paired_ratio, print_rounds

KEY = "bench-key-0123456789"

APP = '''
from synth_deploy.taskapp import TaskApp

task_app = TaskApp("benchlimits", name="bench", description="A trivial rollout.")


@task_app.rollout
async def rollout(request, ctx):
    return {"metrics": {"episode_rewards": [1.0], "num_steps": 1}}
'''

SETTINGS = """
from synth_deploy.env import Env
from synth_deploy.serving import LocalRunner, ServerKeys, ServeSettings
settings = ServeSettings(app=%(app)r, env=Env(), keys=ServerKeys((%(key)r,), "bench"),
                         port=%(port)d, log_level="warning")
"""
BOUNDED = SETTINGS + "LocalRunner(settings).serve_forever()\n"
# Everything `serve_forever` sets but the protocol: the difference is the bounds alone.
PLAIN = SETTINGS + """
import uvicorn
uvicorn.run(LocalRunner(settings).build(), host="127.0.0.1", port=%(port)d,
            log_level="warning", timeout_graceful_shutdown=settings.graceful_timeout_s,
            timeout_keep_alive=settings.limits.keep_alive_s)
"""

BODY = {"run_id": "bench", "env": {"seed": 1}, "policy": {"config": {"model": "m"}}}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(source: str, **values: object) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", source % {**values, "port": port}])
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(url + "/", timeout=1)
            return proc, url
        except httpx.HTTPError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise SystemExit(f"server on {url} did not start") from None
            time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    bodies = fixed_body(BODY)
    results: dict[str, list[LoadResult]] = {"bounded": [], "plain": []}
    cpu_per_request: dict[str, list[float]] = {"bounded": [], "plain": []}
    with tempfile.TemporaryDirectory() as tmp:
        app = Path(tmp) / "bench_app.py"
        app.write_text(APP)
        servers = {name: start(source, app=str(app), key=KEY)
                   for name, source in (("bounded", BOUNDED), ("plain", PLAIN))}
        try:
            order = list(servers.items())
            for _, (_, url) in order:
                load(url, bodies, KEY, seconds=0.5, concurrency=args.concurrency)
            for round_no in range(args.rounds):
                for name, (proc, url) in order if round_no % 2 == 0 else reversed(order):
                    before = cpu_seconds(proc.pid)
                    result = load(url, bodies, KEY, seconds=args.seconds,
                                  concurrency=args.concurrency)
                    cpu_per_request[name].append((cpu_seconds(proc.pid) - before)
                                                 / result.answered)
                    results[name].append(result)
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(15)
    print_rounds(results)
    rate, p99 = paired_ratio(results, "bounded", "plain")
    cpu = statistics.median(b / p for b, p in zip(cpu_per_request["bounded"],
                                                  cpu_per_request["plain"], strict=True))
    print(f"throughput ratio (bounded/plain): {rate:.2f}x   target >= 0.95x  "
          f"(median of {args.rounds} paired rounds)")
    print(f"p99 latency ratio (bounded/plain): {p99:.2f}x")
    print(f"server CPU per request (bounded/plain): {cpu:.2f}x   target <= 1.05x  "
          f"({statistics.median(cpu_per_request['plain']) * 1e6:.0f} us a request, plain)")


if __name__ == "__main__":
    main()
