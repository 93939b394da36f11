"""What the trace Volume costs a deployed app's rollouts: one container traced to its Volume
against the same container untraced, in one run.

    python bench/volume_traces.py [--pairs 4] [--rounds 2] [--seconds 3] [--concurrency 32]

Each server is the Modal container's own entry (`synth_deploy.modal.container_app`, built from
the variables a deploy plan gives it) under plain uvicorn in its own process, as Modal runs
it. The traced one has TASKAPP_TRACING_ENABLED=1 and a trace Volume committed every
``--commit-s`` seconds (shorter than the default, to make the copies frequent); the untraced
one has TASKAPP_TRACING_ENABLED=0. The Volume is the test stand-in
(tests/standins/modal_volume.py): a commit copies files on this machine, inside the
container's process, where Modal's does that work outside it, so the cost shown is an
upper bound. Each rollout makes five policy calls to the kit's mock policy (its own process).

Target: throughput traced/untraced >= 0.95x. Afterwards the Volume's copy must pass
`integrity_check` and hold a session for every rollout answered (each container drains).
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
    print_rounds,
    rounds_on_fresh_servers,
)

KEY = "sk_env_bench_volume"
STANDINS = Path(__file__).resolve().parents[1] / "tests" / "standins"

CONTAINER = """
import os, sys
sys.path.insert(0, %(standins)r)
os.environ.update({"SYNTH_DEPLOY_TASK_APP": %(app)r, "ENVIRONMENT_API_KEY": %(key)r,
                   "TASKAPP_TRACING_ENABLED": %(tracing)r, "MODAL_TASK_ID": "ta-bench",
                   "SYNTH_TRACE_VOLUME": "bench-traces", "SYNTH_TRACE_COMMIT_S": %(commit)r,
                   "SYNTH_TRACE_VOLUME_DIR": %(view)r + "/bench"})
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


def container(tmp: Path, name: str, app: Path, tracing: str, commit_s: float):
    root = tmp / name
    for sub in ("work", "store", "view"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    return partial(child_server, CONTAINER, ready_path="/", standins=str(STANDINS),
                   app=str(app), key=KEY, tracing=tracing, commit=f"{commit_s:g}",
                   workdir=str(root / "work"), store=str(root / "store"),
                   view=str(root / "view"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4, help="server pairs, each started afresh")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per pair")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--commit-s", type=float, default=1.0,
                        help="the traced container's commit interval")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        app = tmp / "five_calls_app.py"
        app.write_text(FIVE_CALLS_APP)
        with child_server(MOCK_POLICY, ready_path="/") as policy:
            results = rounds_on_fresh_servers(
                {"untraced": container(tmp, "untraced", app, "0", args.commit_s),
                 "volume": container(tmp, "volume", app, "1", args.commit_s)},
                bodies(policy + "/v1"), KEY, pairs=args.pairs, rounds=args.rounds,
                seconds=args.seconds, concurrency=args.concurrency)
        rate, p99 = paired_ratio(results, "volume", "untraced")
        print(f"volume-traced vs untraced container, five policy calls a rollout, "
              f"{args.pairs} fresh pairs x {args.rounds} rounds of {args.seconds:g}s, "
              f"{args.concurrency} connections, commit every {args.commit_s:g}s")
        print_rounds(results)
        cpu = paired_cpu_ratio(results, "volume", "untraced")
        if cpu is not None:
            print(f"  container CPU per rollout volume/untraced {cpu:5.2f}x (writer included)")
        committed = tmp / "volume" / "store" / "bench" / "ta-bench.db"
        conn = sqlite3.connect(committed)
        stored = conn.execute("SELECT COUNT(*) FROM session_traces").fetchone()[0]
        check = conn.execute("PRAGMA integrity_check").fetchone()[0]
        conn.close()
        answered = sum(r.answered for r in results["volume"])
        print(f"  the Volume's copy (every container drained): {stored} sessions for "
              f"{answered} answered (+ warm-up), "
              f"integrity_check {check}")
        if check != "ok" or stored < answered:
            raise SystemExit("the Volume's copy lost rollouts or is damaged")
        print(f"summary: throughput volume/untraced {rate:.2f}x (target >= 0.95), "
              f"p99 {p99:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
