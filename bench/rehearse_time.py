"""Wall time of `synth-deploy rehearse` on the math app, against `smoke` of the same app.

Every command is a fresh child process that serves the math app and the mock policy itself,
run in alternating rounds so machine noise hits all of them alike:

    synth-deploy smoke math                        the baseline: serve, 10 rollouts, report
    synth-deploy rehearse ... --skip idle          step (32), determinism, capacity ramp
    synth-deploy rehearse ...                      the same plus the idle probe (6 s idle)

It prints medians and the ratios to the smoke run. Target: the whole rehearsal well under a
minute (the issue's bound), most of it the idle probe's deliberate wait.

    python bench/rehearse_time.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MATH_RL = Path(__file__).resolve().parents[1] / "apps" / "math" / "configs" / "rl.toml"


def _timed(cmd: list[str], cwd: str) -> float:
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, cwd=cwd, timeout=300)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr.decode()}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cli = [shutil.which("synth-deploy")] if shutil.which("synth-deploy") else \
        [sys.executable, "-m", "synth_deploy.cli"]
    rehearse = [*cli, "rehearse", "--config", str(MATH_RL), "--app", "math", "--no-trace",
                "--json"]
    commands = {
        "smoke math (baseline)": [*cli, "smoke", "math", "--no-trace", "--json"],
        "rehearse --skip idle": [*rehearse, "--skip", "idle"],
        "rehearse (all checks)": rehearse,
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    with tempfile.TemporaryDirectory() as cwd:
        for _ in range(args.rounds):
            for name, cmd in commands.items():
                times[name].append(_timed(cmd, cwd))
    base = statistics.median(times["smoke math (baseline)"])
    print(f"{'command':<24} {'median s':>9} {'× smoke':>8}   runs")
    for name, values in times.items():
        median = statistics.median(values)
        runs = " ".join(f"{v:.1f}" for v in values)
        print(f"{name:<24} {median:>9.2f} {median / base:>8.1f}   {runs}")


if __name__ == "__main__":
    main()
