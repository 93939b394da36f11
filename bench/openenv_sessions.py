"""Sessions per core with slow steps: OpenEnv's own server against `synth-deploy serve`, the same
environment, the same run. Needs the venv of bench/openenv_wire.py (openenv 0.10 and the kit):

    PYTHONPATH=. /tmp/openenv10-venv/bin/python bench/openenv_sessions.py \\
        [--levels 256,512,1024,1536] [--wait 10] [--steps 1]

What it mirrors: OpenEnv's published "256 sessions a core" (meta-pytorch/OpenEnv,
tutorial/03-scaling.md; data and code in burtenshaw/openenv-scaling). There the environment's
``step`` is sync and blocks in ``time.sleep(wait_seconds)`` (benchmark_environment.py; OpenEnv's
server runs each session's calls on a thread of its own), the server is `create_app` under
uvicorn, and the client (tests/test_scaling.py, WebSocket mode) opens N raw WebSockets at once,
each connect, reset, one step, close, each operation bounded by 120 s; a level's "max batch"
is the largest N with >= 95 % of sessions ok, "per core" divides it by the uvicorn workers.
Their 256 a core is 2,048 sessions on 8 workers; the p99 they print beside it (1.97 s, total
per session) was measured with 1-s steps (their tables.md, "Latency Breakdown at Max Load
(wait=1.0s)"), though the page says 10 s; their max batch is the same at 1 s and 5 s.

Here: the same environment (bench/openenv_wait_env.py), served by OpenEnv's server
(`_openenv_side.py serve-wait`) and by `synth-deploy serve bench/openenv_wait_app.py`, each
one process pinned to core 0, the client (`_openenv_side.py sessions`, their ws_session) on
core 1. Both servers hold the top level's sessions at once (OpenEnv's ``max_concurrent_envs``,
the kit's ``--max-rollouts``). Per level and server it prints sessions ok, the step's p50/p99
(its overhead above the wait) and the total's p99, then each server's knee: the largest level
with >= 95 % of sessions ok and a p99 step under twice the wait.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from openenv_wire import KEY, SIDE, Served, failures, free_port, kit, report, side

ROOT = Path(__file__).resolve().parents[1]


def ok_level(row: dict, wait: float) -> bool:
    return row["ok"] >= 0.95 * row["sessions"] and (row["step_p99"] or 0) < 2 * max(wait, 0.5)


def describe(row: dict, wait: float) -> str:
    if not row["ok"]:
        return f"0/{row['sessions']} ok ({'; '.join(row['errors'][:2])})"
    return (f"{row['ok']}/{row['sessions']} ok, step p50 {row['step_p50']:.2f} s "
            f"(+{row['step_p50'] - wait:.2f}) p99 {row['step_p99']:.2f} s "
            f"(+{row['step_p99'] - wait:.2f}), total p99 {row['total_p99']:.2f} s"
            + (f", errors: {'; '.join(row['errors'][:2])}" if row["errors"] else ""))


def sessions_per_core(python: str, levels: list[int], wait: float, steps: int) -> None:
    top = max(levels)
    theirs_port, ours_port = free_port(), free_port()
    theirs = Served([python, SIDE, "serve-wait", str(theirs_port), "--sessions", str(top)],
                    theirs_port, "/health", cpu="0")
    ours = kit("openenv_wait_app.py", ours_port, None, "--max-rollouts", str(top), cpu="0",
               cwd=str(ROOT / "bench"))
    knees = {"openenv": 0, "synth-deploy": 0}
    with theirs as theirs_url, ours as ours_url:
        for sessions in levels:
            row = {}
            for name, url, key in (("openenv", theirs_url, None),
                                   ("synth-deploy", ours_url + "/openenv", KEY)):
                args = ["sessions", url, "--sessions", str(sessions), "--wait", str(wait),
                        "--steps", str(steps)]
                row[name] = side(python, *args, *(["--key", key] if key else []), cpu="1",
                                 timeout=600)
                if ok_level(row[name], wait):
                    knees[name] = max(knees[name], sessions)
            a, b = row["openenv"], row["synth-deploy"]
            ratio = (f"; p99 step ours/OpenEnv's {b['step_p99'] / a['step_p99']:.2f}x"
                     if a["ok"] and b["ok"] else "")
            report(f"sessions {sessions}", ok_level(b, wait) or not ok_level(a, wait),
                   f"ours: {describe(b, wait)} | OpenEnv: {describe(a, wait)}{ratio}")
    report("sessions per core", knees["synth-deploy"] >= knees["openenv"],
           f"ours {knees['synth-deploy']}, OpenEnv's {knees['openenv']} (one core each, "
           f"{wait:g}-s steps; the largest level with >= 95 % ok and p99 step < 2x the wait)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="256,512,1024,1536")
    parser.add_argument("--wait", type=float, default=10.0)
    parser.add_argument("--steps", type=int, default=1)
    args = parser.parse_args()
    sessions_per_core(sys.executable, [int(x) for x in args.levels.split(",")], args.wait,
                      args.steps)
    print(f"{len(failures)} failed" if failures else "all ok")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
