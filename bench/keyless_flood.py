"""A keyed client beside a keyless flood (issue 50, item 6): what the flood takes from it.

A trivial task app is served as `synth-deploy serve` serves it (`LocalRunner.serve_forever()`
in a child process, pinned to core 0; the load generators on core 1). Each round measures
the keyed client (wrk, ``--concurrency`` connections POSTing /rollout with the key) alone,
then again while a keyless wrk of ``--flood`` connections POSTs /rollout without a key.
Printed per round: the keyed throughput alone and flooded, their ratio, the keyed requests
that took past 10 s (wrk's timeouts), the 401s the server answered a second, and, from the
server's own CPU time (what a shared machine leaves steady), what a rollout and a refusal
cost it and the share of its core the flood took alone (as fast as it was answered).
Target: flooded / alone >= 0.8 and 0 keyed requests past 10 s.

    python bench/keyless_flood.py [--rounds 3] [--seconds 10] [--concurrency 256]
        [--flood 256]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from _harness import free_port

KEY = "bench-key-0123456789abcdef"
APP = '''
from synth_deploy.taskapp import TaskApp

task_app = TaskApp("benchflood", name="bench", description="A trivial rollout.")


@task_app.rollout
async def rollout(request, ctx):
    return {"metrics": {"episode_rewards": [1.0], "num_steps": 1}}
'''
SERVER = """
from synth_deploy.env import Env
from synth_deploy.serving import LocalRunner, ServerKeys, ServeSettings
LocalRunner(ServeSettings(app=%(app)r, env=Env(), keys=ServerKeys((%(key)r,), "bench"),
                          port=%(port)d, log_level="warning")).serve_forever()
"""
BODY = {"run_id": "bench", "env": {"seed": 1}, "policy": {"config": {"model": "m"}}}
SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
%s
wrk.body = %s
"""


def cores() -> tuple[list[str], list[str]]:
    """taskset prefixes for the server and the clients (none on a single core)."""
    if (os.cpu_count() or 1) < 2 or not Path("/usr/bin/taskset").exists():
        return [], []
    return ["taskset", "-c", "0"], ["taskset", "-c", "1"]


def wrk(url: str, *, key: str | None, seconds: int, connections: int,
        client: list[str]) -> subprocess.Popen:
    header = f'wrk.headers["X-API-Key"] = {json.dumps(key)}' if key else ""
    script = tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False)
    script.write(SCRIPT % (header, json.dumps(json.dumps(BODY))))
    script.close()
    return subprocess.Popen(
        [*client, "wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "10s",
         "-s", script.name, url + "/rollout"], stdout=subprocess.PIPE, text=True)


def result(proc: subprocess.Popen) -> dict:
    out, _ = proc.communicate(timeout=120)
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    count = int(re.search(r"(\d+) requests in", out).group(1))
    timeouts = re.search(r"timeout (\d+)", out)
    return {"rate": rate, "count": count,
            "timeouts": int(timeouts.group(1)) if timeouts else 0}


def cpu_s(pid: int) -> float:
    """The server's CPU time so far (user + system): what a request costs it, whatever
    else the machine runs."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def costed(pid: int, proc: subprocess.Popen) -> dict:
    """``proc``'s result, with the server's CPU microseconds per request it answered."""
    before = cpu_s(pid)
    out = result(proc)
    return {**out, "cpu_us": (cpu_s(pid) - before) * 1e6 / max(out["count"], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--flood", type=int, default=256)
    args = parser.parse_args()
    server_core, client_core = cores()
    with tempfile.TemporaryDirectory() as folder:
        app = Path(folder) / "flood_app.py"
        app.write_text(APP)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        server = subprocess.Popen([*server_core, sys.executable, "-c", SERVER % {
            "app": str(app), "key": KEY, "port": port}])
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    httpx.get(url + "/", timeout=1)
                    break
                except httpx.HTTPError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit("the server did not start") from None
                    time.sleep(0.05)
            rows = []
            for _ in range(args.rounds):
                alone = costed(server.pid, wrk(url, key=KEY, seconds=args.seconds,
                                               connections=args.concurrency,
                                               client=client_core))
                flood_alone = costed(server.pid, wrk(url, key=None, seconds=args.seconds // 2,
                                                     connections=args.flood,
                                                     client=client_core))
                flood = wrk(url, key=None, seconds=args.seconds + 2, connections=args.flood,
                            client=client_core)
                time.sleep(1)  # the flood at full strength before the keyed client starts
                flooded = result(wrk(url, key=KEY, seconds=args.seconds,
                                     connections=args.concurrency, client=client_core))
                rows.append((alone, flooded, result(flood), flood_alone))
        finally:
            server.terminate()
            server.wait(15)
    print(f"keyed client: {args.concurrency} connections; keyless flood: {args.flood}; "
          f"{args.seconds} s each (server on core 0, clients on core 1)")
    print("  401/s: the flood's answers beside the keyed client, then alone; CPU: the\n"
          "  server's per answer; share: of its core, what the flood alone took")
    print(f"{'round':>5} {'alone/s':>8} {'flooded/s':>9} {'ratio':>6} {'>10 s':>5} "
          f"{'401/s':>6} {'alone':>6} {'CPU/200':>7} {'CPU/401':>7} {'share':>6}")
    for i, (alone, flooded, flood, refusals) in enumerate(rows, 1):
        share = refusals["rate"] * refusals["cpu_us"] / 1e6
        print(f"{i:>5} {alone['rate']:>8.0f} {flooded['rate']:>9.0f} "
              f"{flooded['rate'] / alone['rate']:>5.2f}x {flooded['timeouts']:>5} "
              f"{flood['rate']:>6.0f} {refusals['rate']:>6.0f} {alone['cpu_us']:>5.0f}us "
              f"{refusals['cpu_us']:>5.0f}us {share:>6.1%}")
    ratio = statistics.median(f["rate"] / a["rate"] for a, f, _, _ in rows)
    late = sum(f["timeouts"] for _, f, _, _ in rows)
    verdict = "meets" if ratio >= 0.8 and late == 0 else "misses"
    print(f"median ratio {ratio:.2f}x, {late} keyed requests past 10 s ({verdict} the target: "
          ">= 0.8x, 0)")


if __name__ == "__main__":
    main()
