"""Instructions per request: the served kit vs bare Starlette, counted by valgrind.

Time on this machine drifts by a third within an hour; the instructions a server executes per
request do not. Each server of `server_overhead.py` (the kit's untraced trivial rollout, and
the bare Starlette endpoint doing the same JSON work) runs under callgrind. After a warm-up
its counters are zeroed, rollouts are sent, and the counters are dumped: the instructions per
answered request, within a few tenths of a percent from run to run. Two loads: one
connection at a time, and 32 at once.

The ratio says how much more work the kit does per request, not how much more time: under
load a larger program also runs slower per instruction (more cache misses), so the CPU ratio
`server_overhead.py` prints is higher. A change that saves instructions shows here at once,
where a time measurement could not tell it from noise.

    python bench/server_instructions.py [--seconds 20]    (needs valgrind: apt install valgrind)
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _harness import child_server, fixed_body, load, server_pid
from server_overhead import BARE_SERVER, BODY, KEY, TRIVIAL_APP
from trace_throughput import SERVE

LOADS = {"serial": 1, "32 at once": 32}


def counted(dump_to: Path, pid: int, url: str, seconds: float, concurrency: int) -> float:
    """Instructions per answered request over one load (counters zeroed first)."""
    subprocess.run(["callgrind_control", "--zero", str(pid)], check=True, capture_output=True,
                   timeout=60)
    answered = load(url, fixed_body(BODY), KEY, seconds=seconds, concurrency=concurrency).answered
    before = set(dump_to.parent.glob(dump_to.name + ".*"))
    subprocess.run(["callgrind_control", "--dump", str(pid)], check=True, capture_output=True,
                   timeout=60)
    deadline = time.monotonic() + 60
    while not (new := set(dump_to.parent.glob(dump_to.name + ".*")) - before):
        if time.monotonic() > deadline:
            raise SystemExit(f"callgrind wrote no dump for pid {pid}")
        time.sleep(0.2)
    text = new.pop().read_text(errors="replace")
    total = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
    if total is None:
        raise SystemExit("a callgrind dump without a total")
    return int(total.group(1)) / answered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="each load's length (a server under valgrind runs ~50x slower)")
    args = parser.parse_args()
    missing = [tool for tool in ("valgrind", "callgrind_control") if shutil.which(tool) is None]
    if missing:
        raise SystemExit(f"{', '.join(missing)} not found: install valgrind "
                         "(`apt-get install valgrind`)")

    counts: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        app = tmp / "trivial_app.py"
        app.write_text(TRIVIAL_APP)
        servers = {"kit": (SERVE, {"app": str(app), "db": "", "ready_path": "/"}),
                   "bare": (BARE_SERVER, {"ready_path": "/rollout"})}
        for name, (source, values) in servers.items():
            dump_to = tmp / f"{name}.callgrind"
            wrapper = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={dump_to}",
                       f"--log-file={tmp / name}.valgrind.log"]  # its notes, not the output
            with child_server(source, wrapper=wrapper, start_timeout_s=300, key=KEY,
                              **values) as url:
                pid = server_pid(url)
                assert pid is not None
                load(url, fixed_body(BODY), KEY, seconds=args.seconds / 4, concurrency=4)
                counts[name] = {label: counted(dump_to, pid, url, args.seconds, concurrency)
                                for label, concurrency in LOADS.items()}

    print(f"instructions per untraced trivial rollout (callgrind, {args.seconds:g}s per load)")
    print(f"  {'load':<12} {'kit':>10} {'bare':>10}   kit/bare")
    for label in LOADS:
        kit, bare = counts["kit"][label], counts["bare"][label]
        print(f"  {label:<12} {kit / 1000:9.0f}k {bare / 1000:9.0f}k   {kit / bare:.3f}x")


if __name__ == "__main__":
    sys.exit(main())
