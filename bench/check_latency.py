"""Latency of `synth-deploy check` against a healthy local app, process start included.

The math task app is served on a free loopback port in this process; every command below is
a fresh child process, run in alternating rounds so machine noise hits all of them alike:

    python -c pass                      interpreter start (the floor)
    synth-deploy --help                 CLI start (typer and the command modules)
    synth-deploy check URL --json       the whole check: 11 steps, 9 HTTP requests
    synth-deploy check URL              the same, rendered as a table

It also times `health.check()` in-process (no process start). It prints medians and the
ratios check / interpreter start and check / CLI start. Target: the check well under 1 s.

    python bench/check_latency.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

from synth_deploy.env import mint_key
from synth_deploy.health import check
from synth_deploy.serving import BackgroundServer, create_app
from synth_deploy.taskapp.registry import load_app


def _timed(cmd: list[str], env: dict[str, str], expect: int = 0) -> float:
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, env=env, timeout=60)
    elapsed = time.perf_counter() - started
    if proc.returncode != expect:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr.decode()}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    key = mint_key()
    cli = [shutil.which("synth-deploy")] if shutil.which("synth-deploy") else \
        [sys.executable, "-m", "synth_deploy.cli"]
    env = {**os.environ, "ENVIRONMENT_API_KEY": key}
    with BackgroundServer(create_app(load_app("math").build_config(), api_keys=[key])) as srv:
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "synth-deploy --help": [*cli, "--help"],
            "synth-deploy check --json": [*cli, "check", srv.url, "--json"],
            "synth-deploy check (table)": [*cli, "check", srv.url],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        for cmd in commands.values():  # warm the OS file cache once
            _timed(cmd, env)
        for _ in range(args.rounds):
            for name, cmd in commands.items():
                times[name].append(_timed(cmd, env))
        in_process = []
        for _ in range(args.rounds * 3):
            started = time.perf_counter()
            report = check(srv.url, key)  # seed 0, the default
            in_process.append(time.perf_counter() - started)
            assert report.healthy, report.summary()

    med = {name: statistics.median(values) for name, values in times.items()}
    print(f"rounds: {args.rounds} (medians; min in brackets)")
    for name, values in times.items():
        print(f"  {name:<28} {med[name] * 1000:7.0f} ms  [{min(values) * 1000:.0f}]")
    print(f"  {'health.check() in-process':<28} {statistics.median(in_process) * 1000:7.1f} ms"
          f"  [{min(in_process) * 1000:.1f}]")
    check_json = med["synth-deploy check --json"]
    print("ratios:")
    print(f"  check --json / python -c pass      {check_json / med['python -c pass']:5.2f}x")
    print(f"  check --json / synth-deploy --help {check_json / med['synth-deploy --help']:5.2f}x")
    print(f"  check (table) / check --json       "
          f"{med['synth-deploy check (table)'] / check_json:5.2f}x")
    verdict = "well under" if check_json < 0.8 else "under" if check_json < 1.0 else "OVER"
    print(f"check of a healthy local app: {check_json * 1000:.0f} ms, {verdict} 1 s")


if __name__ == "__main__":
    main()
