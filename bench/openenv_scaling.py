"""Thousands of OpenEnv sessions on one core, measured with openenv-scaling's own client and
environment: does the kit hold what it can and refuse the rest promptly? Needs a throwaway venv
with openenv, websockets and the kit, and a checkout of burtenshaw/openenv-scaling; never in CI:

    git clone https://github.com/burtenshaw/openenv-scaling /tmp/oescale
    python -m venv /tmp/oe && /tmp/oe/bin/pip install openenv==0.10.0 websockets
    /tmp/oe/bin/pip install -e .                                       # the kit, beside it
    /tmp/oe/bin/python bench/openenv_scaling.py --scaling /tmp/oescale [--runs 3]

The environment is openenv-scaling's `benchmark` (its `step` sleeps `wait_seconds`), served
unchanged by `synth-deploy serve` (`task_app.openenv(BenchmarkEnvironment, ...)`, --no-trace,
--no-auth: their client sends no key) pinned to core 0; their `tests/test_scaling.py` (WebSocket
mode: each session connects, resets, steps once, closes) runs on core 1, unmodified, its
results read from its `raw.jsonl`. Per run, one server declaring 16,384 sessions (past the
kit's default of 4,096, to find where one core stops) takes batches of 2,048, 4,096 and
8,192 sessions in turn; per batch: sessions ok, step p50/p99 over the wait (target: >= 95 % ok,
p99 <= 3x the wait at 4,096 and 8,192 in every run); a batch that misses says how long the
server's loop thread got no CPU while its process used a core (its own threads starving it).

Then `limit`: a server whose session limit is --limit (default: the kit's own) takes a
batch of --limit + 2,048; a
probe connecting while it is full times its refusal (target: CAPACITY_REACHED within a
second) and the sessions held finish (target: >= 95 % of those admitted ok).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

failures: list[str] = []
APP = '''from benchmark.models import BenchmarkAction, BenchmarkObservation
from benchmark.server.benchmark_environment import BenchmarkEnvironment

from synth_deploy.taskapp import TaskApp

task_app = TaskApp("benchmark", name="benchmark", description="openenv-scaling's benchmark.")
task_app.openenv(BenchmarkEnvironment, BenchmarkAction, BenchmarkObservation,
                 env_name="benchmark", max_concurrent_envs={limit})
'''


def report(name: str, ok: bool, detail: Any = "") -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' if detail else ''}{detail}", flush=True)
    if not ok:
        failures.append(name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Kit:
    """`synth-deploy serve` of the benchmark app, on core 0, until the block ends."""

    def __init__(self, scaling: Path, tmp: Path, limit: int) -> None:
        self.app = tmp / f"benchmark_{limit}.py"
        self.app.write_text(APP.format(limit=limit))
        self.scaling, self.limit, self.port = scaling, limit, free_port()

    def __enter__(self) -> str:
        cli = str(Path(sys.executable).parent / "synth-deploy")
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(
            ["taskset", "-c", "0", cli, "serve", str(self.app), "--port", str(self.port),
             "--no-trace", "--no-auth", "--max-rollouts", str(self.limit)],
            env={**os.environ, "PYTHONPATH": str(self.scaling), "ENVIRONMENT_API_KEY": "unused"},
            cwd=self.app.parent, stdout=subprocess.DEVNULL, stderr=self.log)
        url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"serve exited: {self.log.read()[-2000:]}")
            try:
                httpx.get(url + "/openenv/health", timeout=2)
                return url + "/openenv"
            except httpx.HTTPError:
                time.sleep(0.2)
        self.__exit__()
        raise RuntimeError("serve did not start")

    def __exit__(self, *exc: Any) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(60)
        self.log.close()


class LoopStarvation:
    """While the block runs, the server's main thread (its event loop) and the whole process
    read from /proc twice a second: the longest stretch in which the process used a core
    while its loop's thread got none, said when a batch misses its target (a server that
    went silent: its loop starved by its own threads, or busy itself)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.longest_s, self._done = pid, 0.0, threading.Event()

    def _ticks(self, stat: str) -> int:
        try:
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0
        return int(fields[11]) + int(fields[12])

    def _watch(self) -> None:
        starved_since = None
        last = (self._ticks(f"/proc/{self.pid}/stat"),
                self._ticks(f"/proc/{self.pid}/task/{self.pid}/stat"))
        while not self._done.wait(0.5):
            now = (self._ticks(f"/proc/{self.pid}/stat"),
                   self._ticks(f"/proc/{self.pid}/task/{self.pid}/stat"))
            busy, loop_ran = now[0] - last[0] >= 25, now[1] > last[1]  # half a core or more
            last = now
            if busy and not loop_ran:
                starved_since = starved_since or time.monotonic() - 0.5
                self.longest_s = max(self.longest_s, time.monotonic() - starved_since)
            else:
                starved_since = None

    def __enter__(self) -> LoopStarvation:
        threading.Thread(target=self._watch, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()

    def said(self) -> str:
        return (f"; the server's loop thread got no CPU for {self.longest_s:.1f} s while the "
                "process used a core" if self.longest_s >= 1.0 else "")


def batch(scaling: Path, url: str, sessions: int, wait: float, out: Path) -> list[dict]:
    """Their client, one batch, on core 1: each session's row from its raw.jsonl."""
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(["taskset", "-c", "1", sys.executable,
                    str(scaling / "tests" / "test_scaling.py"), "--url", url, "-n",
                    str(sessions), "--wait", str(wait), "--mode", "ws", "--timeout", "120",
                    "--output-dir", str(out)], check=True, capture_output=True, timeout=900)
    return [json.loads(line) for line in (out / "raw.jsonl").read_text().splitlines()]


def percentile(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))] if values else float("nan")


def describe(rows: list[dict], wait: float) -> tuple[float, float, str]:
    ok = [r for r in rows if r["success"]]
    steps = [r["step_latency"] for r in ok]
    share = len(ok) / len(rows)
    p50, p99 = percentile(steps, 0.5), percentile(steps, 0.99)
    errors = sorted({f"{r['error_type']}: {str(r['error_message'])[:80]}"
                     for r in rows if not r["success"]})
    return share, p99 / wait, (
        f"{len(ok)}/{len(rows)} ok ({100 * share:.1f} %), step p50 {p50 / wait:.2f}x p99 "
        f"{p99 / wait:.2f}x the wait, wall {max(r['total_latency'] for r in rows):.1f} s"
        + (f", errors: {'; '.join(errors[:2])}" if errors else ""))


def probe_refusal(url: str) -> float | None:
    """Seconds from the handshake to CAPACITY_REACHED (None: not refused)."""
    from websockets.sync.client import connect

    t0 = time.perf_counter()
    with connect("ws" + url.removeprefix("http") + "/ws", open_timeout=30) as ws:
        answer = json.loads(ws.recv(timeout=30))  # a full server says so unasked
    refused = answer.get("type") == "error" and answer["data"].get("code") == "CAPACITY_REACHED"
    return time.perf_counter() - t0 if refused else None


def judge_limit(scaling: Path, tmp: Path, limit: int, wait: float) -> None:
    with Kit(scaling, tmp, limit) as url:
        probes: list[float | None] = []

        def probe_when_full() -> None:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                capacity = httpx.get(url + "/health", timeout=30).json()["capacity"]
                if capacity["active_sessions"] >= limit:
                    probes.extend(probe_refusal(url) for _ in range(5))
                    return
                time.sleep(0.05)

        prober = threading.Thread(target=probe_when_full, daemon=True)
        prober.start()
        rows = batch(scaling, url, limit + 2048, max(wait, 5.0), tmp / "limit")
        prober.join(60)
    admitted = [r for r in rows if r["success"] or not any(
        sign in str(r["error_message"]) for sign in ("CAPACITY_REACHED", "at capacity"))]
    held = sum(1 for r in admitted if r["success"])
    refused = len(rows) - len(admitted)
    slowest = max((p for p in probes if p is not None), default=None)
    report(f"limit {limit}", bool(probes) and None not in probes and slowest is not None
           and slowest < 1.0 and held >= 0.95 * len(admitted),
           f"{held}/{len(admitted)} admitted sessions ok, {refused} refused "
           f"CAPACITY_REACHED; a probe while full refused in "
           + (f"{1000 * slowest:.0f} ms at most ({len(probes)} probes)" if probes and
              None not in probes else f"{probes} (None: not refused)"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scaling", required=True, type=Path,
                        help="a checkout of burtenshaw/openenv-scaling")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batches", default="2048,4096,8192")
    parser.add_argument("--wait", type=float, default=1.0)
    parser.add_argument("--limit", type=int, default=4096)
    args = parser.parse_args()
    scaling = args.scaling.resolve()
    batches = [int(n) for n in args.batches.split(",")]
    with tempfile.TemporaryDirectory(prefix="openenv-scaling-") as tmp_name:
        tmp = Path(tmp_name)
        for run in range(1, args.runs + 1):
            kit = Kit(scaling, tmp, 16384)
            with kit as url:
                for sessions in batches:
                    with LoopStarvation(kit.proc.pid) as starvation:
                        rows = batch(scaling, url, sessions, args.wait, tmp / f"{run}-{sessions}")
                    share, p99, detail = describe(rows, args.wait)
                    target = share >= 0.95 and p99 <= 3 if sessions >= 4096 else share >= 0.95
                    report(f"run {run} batch {sessions}", target,
                           detail + ("" if target else starvation.said()))
        judge_limit(scaling, tmp, args.limit, args.wait)
    print(f"{len(failures)} failed" if failures else "all ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
