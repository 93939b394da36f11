"""What the trace Volume costs a deployed app's rollouts: one container traced to its Volume
against the same container untraced, and traced to its own disk, in one run.

    python bench/volume_traces.py [--in-flight 256] [--policy-ms 200]
                                  [--pairs 16] [--rounds 4] [--seconds 0.5] [--concurrency 32]

Each server is the Modal container's own entry (`synth_deploy.modal.container_app`, built from
the variables a deploy plan gives it) under plain uvicorn in its own process, as Modal runs
it: untraced (TASKAPP_TRACING_ENABLED=0), traced to a store on its disk only (what the
Volume adds to, i.e. tracing's own cost), and traced to the Volume, committed every
``--commit-s`` seconds (default: the deploy default). The Volume is the test stand-in
(tests/standins/modal_volume.py): a commit copies files on this machine, inside the
container's process, where Modal's does that work outside it, so the cost shown is an
upper bound. Each rollout makes five policy calls to the kit's mock policy (its own process).

Two loads, each on fresh container triples:

- **In flight**, the run users have: ``--in-flight`` episodes at once, each of five policy
  calls the mock answers after ``--policy-ms`` on average (an LLM's turn, shortened), so
  that rollouts wait on their policy and the machine has CPU to spare. What it measures is
  the request path: a rollout that waited on the Volume, on a commit or on the copier's
  thread would take longer, and throughput with it (a control that made each rollout wait
  about a twentieth of its time after its append came out a few points lower). Target:
  volume/untraced >= 0.95x.
- **Saturated**: ``--concurrency`` clients against a policy that answers at once, so that
  trivial rollouts take all the CPU this machine has (the server, the mock policy and the
  load client share two cores). What it measures is tracing's CPU price: each microsecond
  of it is a rollout fewer. Here volume/disk is the Volume's own share.

The summaries give the median of the fresh triples' own median ratios and the interval it
lies in (95 %): a triple's rounds share its processes' luck, which moved one
triple's ratio from 0.78x to the next one's 1.22x at saturation, so the default there is
many triples of few short rounds (16 x 4 of 0.5 s). The disk container's
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
    LoadResult,
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

# The same mock, answering each call after a random half to one and a half times
# ``delay_s``: a policy that takes its time, and not the same time for every call, as a
# model's does not (episodes that all waited alike come back together, in waves the server
# then queues).
SLOW_POLICY = """
import asyncio, random, uvicorn
from synth_deploy.runs import create_mock_policy_app
mock = create_mock_policy_app()

async def slow(scope, receive, send):
    if scope["type"] == "http":
        await asyncio.sleep(%(delay_s)r * random.uniform(0.5, 1.5))
    await mock(scope, receive, send)

uvicorn.run(slow, host="127.0.0.1", port=%(port)d, log_level="warning", access_log=False)
"""
# In flight, rollouts last about a second: rounds long enough for a few of each, and few
# triples, since a rollout's time is the policy's and a process's luck barely moves it.
FLIGHT_PAIRS, FLIGHT_ROUNDS, FLIGHT_SECONDS = 4, 2, 3.0

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
    parser.add_argument("--in-flight", type=int, default=256,
                        help="episodes at once in the in-flight load (0: skip it)")
    parser.add_argument("--policy-ms", type=float, default=200,
                        help="how long the in-flight load's policy takes to answer a call")
    # Many triples: each container's process has luck of its own (where its memory falls),
    # as large as tracing's cost at saturation, and only fresh processes average it out.
    parser.add_argument("--pairs", type=int, default=16,
                        help="container triples at saturation, each started afresh")
    # Short rounds: a round's three containers are loaded one after another, and this
    # machine's speed drifts within seconds (the same container measured 455 and 734
    # rollouts/s a minute apart), so the closer together they are, the less of that drift a
    # round's ratio holds.
    parser.add_argument("--rounds", type=int, default=4, help="rounds per triple")
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--concurrency", type=int, default=32,
                        help="clients at saturation (0: skip it)")
    parser.add_argument("--commit-s", type=float, default=DEFAULT_TRACE_COMMIT_S,
                        help="the Volume's commit interval (default: the deploy default; "
                             "lower it to stress the copies)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        app = tmp / "five_calls_app.py"
        app.write_text(FIVE_CALLS_APP)
        triple = {name: container(tmp, name, app, tracing=name != "untraced",
                                  volume=name == "volume", commit_s=args.commit_s)
                  for name in ("untraced", "disk", "volume")}
        print(f"containers untraced, traced to their disk, traced to the Volume; five policy "
              f"calls a rollout, commit every {args.commit_s:g}s")
        answered = 0
        summary = []
        if args.in_flight:
            with child_server(SLOW_POLICY, ready_path="/",
                              delay_s=args.policy_ms / 1000) as policy:
                flight = rounds_on_fresh_servers(
                    triple, bodies(policy + "/v1"), KEY, pairs=FLIGHT_PAIRS,
                    rounds=FLIGHT_ROUNDS, seconds=FLIGHT_SECONDS, concurrency=args.in_flight)
            print(f"\nin flight: {args.in_flight} episodes at once, the policy answering in "
                  f"about {args.policy_ms:g} ms; {FLIGHT_PAIRS} fresh triples x "
                  f"{FLIGHT_ROUNDS} rounds of {FLIGHT_SECONDS:g}s")
            _report(flight)
            answered += sum(r.answered for r in flight["volume"])
            summary.append(_summary("in flight (the request path)", flight, FLIGHT_ROUNDS,
                                    target=True))
        if args.concurrency:
            with child_server(MOCK_POLICY, ready_path="/") as policy:
                saturated = rounds_on_fresh_servers(
                    triple, bodies(policy + "/v1"), KEY, pairs=args.pairs,
                    rounds=args.rounds, seconds=args.seconds, concurrency=args.concurrency)
            print(f"\nsaturated: {args.concurrency} connections, the policy answering at once;"
                  f" {args.pairs} fresh triples x {args.rounds} rounds of {args.seconds:g}s")
            _report(saturated)
            answered += sum(r.answered for r in saturated["volume"])
            summary.append(_summary("saturated (tracing's CPU price)", saturated,
                                    args.rounds, target=False))
        _check_volume(tmp / "volume" / "store" / "bench", answered)
        print("\n".join(summary))


def _report(results: dict[str, list[LoadResult]]) -> None:
    print_rounds(results)
    for num, den in (("volume", "untraced"), ("disk", "untraced"), ("volume", "disk")):
        cpu = paired_cpu_ratio(results, num, den)
        if cpu is not None:
            print(f"  container CPU per rollout {num}/{den} {cpu:5.2f}x (writer included)")
    for name in results:
        print_cpu_split(results, name)


def _summary(load: str, results: dict[str, list[LoadResult]], rounds: int, *,
             target: bool) -> str:
    rate, low, high = paired_ratio_interval(results, "volume", "untraced", rounds=rounds)
    _, p99 = paired_ratio(results, "volume", "untraced")
    own_rate, own_p99 = paired_ratio(results, "volume", "disk")
    aim = "target >= 0.95; " if target else ""
    return (f"summary, {load}: throughput volume/untraced {rate:.2f}x (the triples' median; "
            f"{aim}95% interval {low:.2f}-{high:.2f}x), p99 {p99:.2f}x; the Volume alone "
            f"(volume/disk) {own_rate:.2f}x, p99 {own_p99:.2f}x")


def _check_volume(folder: Path, answered: int) -> None:
    """Every SQLite segment on the Volume passes `integrity_check`, and the files hold a
    session for each of the ``answered`` rollouts (every container drained)."""
    segments = sorted(folder.glob("ta-bench.*.*"))
    stored: set[str] = set()
    checks = set()
    for segment in segments:
        if segment.suffix == ".log":  # a copy of the session log's records
            stored |= {session_id for session_id, _, _ in read_session_log(segment).records}
            continue
        conn = sqlite3.connect(segment)
        stored |= {row[0] for row in conn.execute(
            "SELECT session_id FROM session_traces "
            "UNION SELECT session_id FROM session_journal")}
        checks.add(conn.execute("PRAGMA integrity_check").fetchone()[0])
        conn.close()
    check = "ok" if checks <= {"ok"} else ", ".join(sorted(checks - {"ok"}))
    print(f"\nthe Volume's segments (every container drained): {len(segments)} files, "
          f"{len(stored)} sessions for {answered} answered (+ warm-up), integrity_check {check}")
    if check != "ok" or len(stored) < answered:
        raise SystemExit("the Volume's segments lost rollouts or one is damaged")


if __name__ == "__main__":
    sys.exit(main())
