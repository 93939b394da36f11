"""`synth-deploy --help` against the interpreter's own start, in whole-process CPU.

Each round runs, as fresh child processes and in alternating order so machine noise hits
them alike:

    python -c pass            the interpreter's start (the floor)
    synth-deploy --help       the root help (printed without Typer: synth_deploy/cli/help.txt)
    synth-deploy --version    a command through Typer (what any other command pays to start)

CPU is the child's user + system time (os.wait4), so a loaded machine skews it less than
the wall clock. Target: `--help` ≤ 1.5× `python -c pass`.

    python bench/cli_startup.py [--rounds 20] [--python /tmp/user-venv/bin/python]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from importlib import metadata
from pathlib import Path


def cpu_seconds(command: list[str]) -> float:
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(command)} failed: {proc.stderr.read().decode()}")
    proc.stderr.close()
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter whose installed kit is timed")
    args = parser.parse_args()
    script = str(Path(args.python).with_name("synth-deploy"))
    commands = {
        "python -c pass": [args.python, "-c", "pass"],
        "synth-deploy --help": [script, "--help"],
        "synth-deploy --version": [script, "--version"],
    }
    for command in commands.values():  # warm the bytecode cache
        cpu_seconds(command)
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    for round_no in range(args.rounds):
        order = list(commands.items())
        for name, command in order if round_no % 2 == 0 else reversed(order):
            cpu[name].append(cpu_seconds(command))
    floor = statistics.median(cpu["python -c pass"])
    print(f"typer {metadata.version('typer')}, {args.rounds} paired rounds, kit of {args.python}")
    for name, values in cpu.items():
        median = statistics.median(values)
        print(f"  {name:<24} CPU median {median * 1000:6.1f} ms   {median / floor:5.2f}x")
    ratio = statistics.median(cpu["synth-deploy --help"]) / floor
    print(f"--help / python -c pass: {ratio:.2f}x (target <= 1.5x)")


if __name__ == "__main__":
    main()
