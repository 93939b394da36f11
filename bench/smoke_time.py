"""`synth-deploy smoke math` (10 rollouts, traced) end to end, process start included.

Each command is a fresh child process in a fresh folder (so every smoke run creates its
trace file), run in alternating rounds so machine noise hits all of them alike:

    python -c pass                  interpreter start (the floor)
    synth-deploy --help             CLI start
    synth-deploy smoke math         serve the app and the mock policy, 10 rollouts, traces
    synth-deploy smoke math --no-trace

Bytecode caching is on for the children (as in an installed package), and one run of each
warms it before the timed rounds. Target: `smoke math` under 1 s.

``--python`` times the kit installed in another environment: a user's plain `pip install .`
has none of the test tools (selenium brings trio, which httpcore then imports: ~0.1 s).

    python bench/smoke_time.py [--rounds 5] [--python /tmp/user-venv/bin/python]
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


def commands(python: str) -> dict[str, list[str]]:
    cli = [python, "-m", "synth_deploy.cli"]
    return {
        "python -c pass": [python, "-c", "pass"],
        "synth-deploy --help": [*cli, "--help"],
        "smoke math": [*cli, "smoke", "math"],
        "smoke math --no-trace": [*cli, "smoke", "math", "--no-trace"],
    }


def timed(command: list[str], env: dict[str, str]) -> float:
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=folder,
                              timeout=120)
        elapsed = time.perf_counter() - started
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(command)} exited {proc.returncode}:\n{proc.stderr}")
        if "smoke" in command and "--no-trace" not in command:
            if not (Path(folder) / "traces" / "v3" / "synth_ai.db").exists():
                raise SystemExit("smoke math wrote no trace file")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter whose installed kit is timed")
    args = parser.parse_args()
    timed_commands = commands(args.python)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.pop("SYNTH_TRACES_DB", None)
    os.sync()  # smoke fsyncs its trace file: start from a disk with no earlier writes pending
    for command in timed_commands.values():  # warm the bytecode cache
        timed(command, env)
    times: dict[str, list[float]] = {name: [] for name in timed_commands}
    for round_no in range(args.rounds):
        order = list(timed_commands.items())
        for name, command in order if round_no % 2 == 0 else reversed(order):
            times[name].append(timed(command, env))
    for name, values in times.items():
        print(f"  {name:<24} median {statistics.median(values):5.2f}s   "
              f"(rounds: {', '.join(f'{v:.2f}' for v in values)})")
    smoke = statistics.median(times["smoke math"])
    print(f"kit of {args.python}")
    print(f"smoke math (10 rollouts, traced): {smoke:.2f}s (target < 1 s); "
          f"{smoke - statistics.median(times['synth-deploy --help']):.2f}s beyond CLI start")


if __name__ == "__main__":
    main()
