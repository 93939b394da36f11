"""What the trace Volume costs a deployed app's rollouts: one container traced to its Volume
against the same container untraced, and traced to its own disk, in one run.

    python bench/volume_traces.py [--pairs 16] [--rounds 4] [--seconds 0.5] [--concurrency 32]

Each server is the Modal container's own entry (`synth_deploy.modal.container_app`, built from
the variables a deploy plan gives it) under plain uvicorn in its own process, as Modal runs
it: untraced (TASKAPP_TRACING_ENABLED=0), traced to a store on its disk only (what the
Volume adds to, i.e. tracing's own cost), and traced to the Volume, committed every
``--commit-s`` seconds (default: the deploy default). The Volume is the test stand-in
(tests/standins/modal_volume.py): a commit copies files on this machine, inside the
container's process, where Modal's does that work outside it, so the cost shown is an
upper bound. Each rollout makes five policy calls to the kit's mock policy (its own process).

Target: throughput volume/untraced >= 0.95x; volume/disk is the Volume's own share. The
summary gives the median of the fresh triples' own median ratios and the interval it lies
in (95 %): a triple's rounds share its processes' luck, which moved one
triple's ratio from 0.78x to the next one's 1.22x, so the default is many triples of few
short rounds (16 x 4 of 0.5 s). The disk container's
writer child journals sessions under load and builds their rows once the server is not
busy: the CPU it spends after each load is printed apart (each container is measured once
the one before has gone quiet). The volume container has no writer child: its server
appends each session to the store's session log, copied to the Volume as it is. Afterwards
every SQLite segment on the Volume must pass `integrity_check`, and together with the log
copies they must hold a session for every rollout answered (each container drains).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
from functools import partial
from pathlib import Path

from _harness import (
    child_server,
    paired_cpu_ratio,
    paired_ratio,
    paired_ratio_interval,
    print_cpu_split,
    print_rounds,
    rounds_on_fresh_servers,
)

from synth_deploy.modal import DEFAULT_TRACE_COMMIT_S
from synth_deploy.tracing import read_session_log

KEY = "sk_env_bench_volume"
STANDINS = Path(__file__).resolve().parents[1] / "tests" / "standins"

CONTAINER = """
import os, sys
sys.path.insert(0, %(standins)r)
os.environ.update(%(env)r)
os.chdir(%(workdir)r)
import modal_volume
modal_volume.install({"bench-traces": (%(store)r, %(view)r)}, background_s=5.0)
import uvicorn
from synth_deploy.modal import container_app
uvicorn.run(container_app(), host="127.0.0.1", port=%(port)d, log_level="warning",
            access_log=False, lifespan="on")
"""

MOCK_POLICY = """
import uvicorn
from synth_deploy.runs import create_mock_policy_app
uvicorn.run(create_mock_policy_app(), host="127.0.0.1", port=%(port)d, log_level="warning",
            access_log=False)
"""

FIVE_CALLS_APP = '''
from synth_deploy.taskapp import TaskApp, call_policy

task_app = TaskApp("bench-five", name="five calls", description="five policy calls a rollout")


@task_app.rollout
async def rollout(request, ctx):
    messages = [{"role": "user", "content": f"seed {request.env.seed}"}]
    for turn in range(1, 6):
        ctx.tracer.start_timestep(f"turn-{turn}", turn_number=turn)
        reply = await call_policy(ctx, messages)
        messages.append({"role": "assistant", "content": reply.content})
    ctx.tracer.record_outcome_reward(1.0)
    return {"metrics": {"episode_rewards": [1.0], "num_steps": 5}}
'''


def bodies(inference_url: str):
    def body(i: int) -> bytes:
        return json.dumps({"run_id": f"v{i}", "env": {"seed": i % 1000}, "mode": "rl",
                           "policy": {"config": {"model": "mock",
                                                 "inference_url": inference_url}}}).encode()
    return body


def container(tmp: Path, name: str, app: Path, *, tracing: bool, volume: bool,
              commit_s: float):
    """The container as a deploy plan sets it up: traced or not, with the Volume or not."""
    root = tmp / name
    for sub in ("work", "store", "view"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    env = {"SYNTH_DEPLOY_TASK_APP": str(app), "ENVIRONMENT_API_KEY": KEY,
           "TASKAPP_TRACING_ENABLED": "1" if tracing else "0", "MODAL_TASK_ID": "ta-bench"}
    if volume:
        env.update({"SYNTH_TRACE_VOLUME": "bench-traces", "SYNTH_TRACE_COMMIT_S":
                    f"{commit_s:g}", "SYNTH_TRACE_VOLUME_DIR": str(root / "view" / "bench")})
    return partial(child_server, CONTAINER, ready_path="/", standins=str(STANDINS), env=env,
                   workdir=str(root / "work"), store=str(root / "store"),
                   view=str(root / "view"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Many triples: each container's process has luck of its own (where its memory falls),
    # as large as tracing's cost, and only fresh processes average it out.
    parser.add_argument("--pairs", type=int, default=16,
                        help="container triples, each started afresh")
    # Short rounds: a round's three containers are loaded one after another, and this
    # machine's speed drifts within seconds (the same container measured 455 and 734
    # rollouts/s a minute apart), so the closer together they are, the less of that drift a
    # round's ratio holds.
    parser.add_argument("--rounds", type=int, default=4, help="rounds per triple")
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--commit-s", type=float, default=DEFAULT_TRACE_COMMIT_S,
                        help="the Volume's commit interval (default: the deploy default; "
                             "lower it to stress the copies)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        app = tmp / "five_calls_app.py"
        app.write_text(FIVE_CALLS_APP)
        with child_server(MOCK_POLICY, ready_path="/") as policy:
            commit = args.commit_s
            results = rounds_on_fresh_servers(
                {"untraced": container(tmp, "untraced", app, tracing=False, volume=False,
                                       commit_s=commit),
                 "disk": container(tmp, "disk", app, tracing=True, volume=False,
                                   commit_s=commit),
                 "volume": container(tmp, "volume", app, tracing=True, volume=True,
                                     commit_s=commit)},
                bodies(policy + "/v1"), KEY, pairs=args.pairs, rounds=args.rounds,
                seconds=args.seconds, concurrency=args.concurrency)
        _, p99 = paired_ratio(results, "volume", "untraced")
        own_rate, own_p99 = paired_ratio(results, "volume", "disk")
        print(f"containers untraced, traced to their disk, traced to the Volume; five policy "
              f"calls a rollout, {args.pairs} fresh triples x {args.rounds} rounds of "
              f"{args.seconds:g}s, {args.concurrency} connections, commit every "
              f"{args.commit_s:g}s")
        print_rounds(results)
        for num, den in (("volume", "untraced"), ("disk", "untraced"), ("volume", "disk")):
            cpu = paired_cpu_ratio(results, num, den)
            if cpu is not None:
                print(f"  container CPU per rollout {num}/{den} {cpu:5.2f}x (writer included)")
        for name in results:
            print_cpu_split(results, name)
        segments = sorted((tmp / "volume" / "store" / "bench").glob("ta-bench.*.*"))
        stored: set[str] = set()
        checks = set()
        for segment in segments:
            if segment.suffix == ".log":  # a copy of the session log's records
                stored |= {session_id for session_id, _, _ in
                           read_session_log(segment).records}
                continue
            conn = sqlite3.connect(segment)
            stored |= {row[0] for row in conn.execute(
                "SELECT session_id FROM session_traces "
                "UNION SELECT session_id FROM session_journal")}
            checks.add(conn.execute("PRAGMA integrity_check").fetchone()[0])
            conn.close()
        check = "ok" if checks <= {"ok"} else ", ".join(sorted(checks - {"ok"}))
        answered = sum(r.answered for r in results["volume"])
        print(f"  the Volume's segments (every container drained): {len(segments)} files, "
              f"{len(stored)} sessions for {answered} answered (+ warm-up), "
              f"integrity_check {check}")
        if check != "ok" or len(stored) < answered:
            raise SystemExit("the Volume's segments lost rollouts or one is damaged")
        rate, low, high = paired_ratio_interval(results, "volume", "untraced",
                                                rounds=args.rounds)
        print(f"summary: throughput volume/untraced {rate:.2f}x (the triples' median; "
              f"target >= 0.95; 95% interval {low:.2f}-{high:.2f}x), p99 {p99:.2f}x; the "
              f"Volume alone (volume/disk) {own_rate:.2f}x, p99 {own_p99:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
