"""What a local sandbox costs a command: `Sandbox.run` (its own process group, limits,
network namespace and user) vs the same command as a bare asyncio subprocess, both on this
process's event loop, in the same run; and what starting and ending a sandbox costs.

Printed per run: the bare command's median time, the sandboxed one's and their ratio; a
sandbox's open + close median. Commands: ``true`` (the fixed cost) and ``python3 -c pass``
(an interpreter's start, as `apps/code`'s checker pays).

    python bench/sandbox_commands.py [--n 60] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from synth_deploy.sandbox import LocalBackend, SandboxSettings, open_sandbox

# Found where a sandbox looks (its PATH), so both run the same programs.
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
COMMANDS = ([shutil.which("true", path=SANDBOX_PATH) or "true"],
            [shutil.which("python3", path=SANDBOX_PATH) or "python3", "-c", "pass"])


async def bare(argv: list[str]) -> float:
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE,
                                                env={"PATH": SANDBOX_PATH})
    await proc.communicate()
    return time.perf_counter() - started


async def one_run(n: int, root: Path) -> None:
    backend = LocalBackend(root)
    settings = SandboxSettings()
    opened: list[float] = []
    for argv in COMMANDS:
        plain, boxed = [], []
        async with await open_sandbox(settings, app="bench", rollout="r",
                                      backend=backend) as box:
            for _ in range(n):  # interleaved: both see the same load
                plain.append(await bare(argv))
                started = time.perf_counter()
                result = await box.run(argv)
                boxed.append(time.perf_counter() - started)
                assert result.exit_code == 0, result
        for _ in range(max(5, n // 6)):
            started = time.perf_counter()
            sandbox = await open_sandbox(settings, app="bench", rollout="o", backend=backend)
            await sandbox.terminate()
            opened.append(time.perf_counter() - started)
        p, b = statistics.median(plain), statistics.median(boxed)
        print(f"  {' '.join(argv):<20} bare {p * 1000:6.2f} ms · sandboxed {b * 1000:6.2f} ms"
              f" · ratio {b / p:5.2f}x")
    print(f"  open + close a sandbox   {statistics.median(opened) * 1000:6.2f} ms median "
          f"({backend.isolation()['user']}; network {backend.isolation()['network']})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=60)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sandbox-bench-") as tmp:
        Path(tmp).chmod(0o711)  # each sandbox's own user passes through it
        for run in range(1, args.runs + 1):
            print(f"run {run}")
            asyncio.run(one_run(args.n, Path(tmp) / f"run{run}"))


if __name__ == "__main__":
    main()
