"""What tracing costs a served task app: rollouts with tracing on vs off, in one run.

    python bench/trace_throughput.py [--pairs 6] [--rounds 2] [--seconds 3] [--concurrency 32]

Each app is served the way `synth-deploy serve` serves it (`LocalRunner`, uvicorn, its own
process), once without a trace store and once writing every rollout to one SQLite file;
closed-loop clients in this process load both in alternating rounds, so noise hits both
alike. Ratios are taken within a round, then the median over all rounds.

The pair of servers is started afresh ``--pairs`` times, for ``--rounds`` rounds each: a
process's own speed differs from one start to the next by a few percent (where its memory
and hash tables fall), and one pair kept for every round made that luck the run's result
(two identically configured traced servers measured 0.74x and 0.78x against the same
untraced one, within one run).

- trivial: a rollout that returns at once (tracing is all the work there is).
  Targets: throughput on/off >= 0.80x, p99 on/off <= 2.00x.
- math: the bundled math app asking the kit's mock policy (its own process).
  Target: throughput on/off >= 0.95x.
- five-call: bench/policy_calls.py's episode of five `call_policy` calls, against its lean
  policy that answers at once (so tracing's CPU is as large a share as it gets).
  Target (issue 66): throughput on/off >= 0.90x.

Each round also shows the server's CPU per rollout (the traced one with its writer process).
Afterwards every traced file must pass `integrity_check` and hold a session for every
rollout that was answered 200.
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
    print_cpu_split,
    print_rounds,
    rounds_on_fresh_servers,
)
from server_overhead import TRIVIAL_APP

KEY = "sk_env_bench"

SERVE = """
from synth_deploy.env import Env
from synth_deploy.serving import LocalRunner, ServeSettings, ServerKeys
from synth_deploy.tracing import parse_trace_db
db = %(db)r
LocalRunner(ServeSettings(app=%(app)r, env=Env(), keys=ServerKeys((%(key)r,), "bench"),
                          traces=parse_trace_db(db) if db else None, port=%(port)d,
                          log_level="warning")).serve_forever()
"""

MOCK_POLICY = """
import uvicorn
from synth_deploy.runs import create_mock_policy_app
uvicorn.run(create_mock_policy_app(), host="127.0.0.1", port=%(port)d, log_level="warning",
            access_log=False)
"""

def trivial_body(i: int) -> bytes:
    return json.dumps({"run_id": f"r{i}", "env": {"seed": i % 100, "config": {}},
                       "policy": {"policy_name": "p", "config": {
                           "model": "m", "inference_url": "http://127.0.0.1:1/v1"}},
                       "mode": "rl", "safety": {"max_time_s": 60}}).encode()


def math_body(inference_url: str):
    def body(i: int) -> bytes:
        return json.dumps({"run_id": f"m{i}", "env": {"seed": i % 9000}, "mode": "rl",
                           "policy": {"config": {"model": "mock",
                                                 "inference_url": inference_url}}}).encode()
    return body


def compare(name: str, app: str, bodies, tmp: Path, args: argparse.Namespace,
            targets: str) -> tuple[float, float, int]:
    db = tmp / f"{name}.db"
    results = rounds_on_fresh_servers(
        {"off": partial(child_server, SERVE, ready_path="/", app=app, db="", key=KEY),
         "on": partial(child_server, SERVE, ready_path="/", app=app, db=str(db), key=KEY)},
        bodies, KEY, pairs=args.pairs, rounds=args.rounds, seconds=args.seconds,
        concurrency=args.concurrency)
    rate, p99 = paired_ratio(results, "on", "off")
    answered = sum(r.answered for r in results["on"])
    print(f"{name}: tracing off vs on, {args.pairs} fresh pairs of servers x {args.rounds} "
          f"rounds of {args.seconds:g}s, {args.concurrency} connections")
    print_rounds(results)
    print(f"  throughput on/off {rate:5.2f}x   p99 on/off {p99:5.2f}x   ({targets})")
    cpu = paired_cpu_ratio(results, "on", "off")
    if cpu is not None:  # the traced server's CPU includes its writer process
        print(f"  server CPU per rollout on/off {cpu:5.2f}x (writer process included)")
        print_cpu_split(results, "on")
    conn = sqlite3.connect(db)
    stored = conn.execute("SELECT COUNT(*) FROM session_traces").fetchone()[0]
    check = conn.execute("PRAGMA integrity_check").fetchone()[0]
    conn.close()
    print(f"  traced file: {stored} sessions for {answered} answered rollouts (+ warm-up), "
          f"integrity_check {check}")
    if check != "ok" or stored < answered:
        raise SystemExit("the traced file lost rollouts or is damaged")
    return rate, p99, stored


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=6, help="server pairs, each started afresh")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per pair")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--only", choices=("trivial", "math", "five-call"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        summary = []
        if args.only in (None, "trivial"):
            app = tmp / "trivial_app.py"
            app.write_text(TRIVIAL_APP)
            rate, p99, _ = compare("trivial", str(app), trivial_body, tmp, args,
                                   "targets >= 0.80x, <= 2.00x")
            summary.append(f"trivial on/off {rate:.2f}x (>= 0.80), p99 {p99:.2f}x (<= 2.00)")
        if args.only in (None, "math"):
            with child_server(MOCK_POLICY, ready_path="/") as policy:
                rate, p99, _ = compare("math", "math", math_body(policy + "/v1"), tmp, args,
                                       "target >= 0.95x")
            summary.append(f"math on/off {rate:.2f}x (>= 0.95), p99 {p99:.2f}x")
        if args.only in (None, "five-call"):
            from policy_calls import APP as FIVE_CALLS
            from policy_calls import POLICY as LEAN_POLICY

            app = tmp / "five_calls.py"
            app.write_text(FIVE_CALLS % {"before": "", "calls": 5})
            with child_server(LEAN_POLICY, ready_path="/", delay=0) as policy:
                rate, p99, _ = compare("five-call", str(app), math_body(policy + "/v1"), tmp,
                                       args, "target >= 0.90x")
            summary.append(f"five-call on/off {rate:.2f}x (>= 0.90), p99 {p99:.2f}x")
        print("summary: " + "; ".join(summary))


if __name__ == "__main__":
    sys.exit(main())
