"""Server overhead: a trivial rollout through `synth-deploy serve` as users run it, against
bare Starlette on uvicorn's fast path (httptools + uvloop), traced and untraced.

"serve" is the CLI with its defaults (`synth-deploy serve APP --no-trace`: the kit's own
protocol, its summary line, no access log); "traced" the same with `--trace-db` (every
rollout committed to SQLite before its answer); "bare" a Starlette route under plain uvicorn
with `http="httptools", loop="uvloop"` doing the same JSON work (check the key header, parse
the request, answer a RolloutResponse-shaped body): the fastest floor here, and the same
protocol and loop the kit runs on. "checked" is the bare endpoint validating the request and
the response with the protocol's own models, so a run also says how much of the gap is the
price of checking the wire protocol.

Each server runs in its own process; wrk (32 connections, one thread) loads them in
alternating rounds within one run, so machine noise hits all of them, and the ratios are
taken within a round, then the median over rounds; the servers are started afresh
``--pairs`` times. Targets: serve/bare >= 0.90x (>= 0.60x is issue 37's floor against the
fast path), traced/serve >= 0.80x. The last line splits the traced server's CPU: its own
process against untraced `serve`'s, and its writer child's, which shares the machine's cores
with wrk here (a deployed app's clients are elsewhere).

    python bench/server_overhead.py [--pairs 3] [--rounds 4] [--seconds 2] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from functools import partial
from pathlib import Path

from _harness import (
    child_server,
    fixed_body,
    paired_cpu_ratio,
    print_ratios,
    print_rounds,
    rounds_on_fresh_servers,
    wrk_load,
)

KEY = "sk_env_bench_0123456789abcdef0123"

TRIVIAL_APP = '''
from synth_deploy.taskapp import TaskApp

task_app = TaskApp("bench-trivial", name="trivial", description="returns at once")


@task_app.rollout
async def rollout(request, ctx):
    return {"run_id": request.run_id, "metrics": {"episode_rewards": [1.0], "num_steps": 1}}
'''

# `synth-deploy serve` exactly as a user types it (the console script calls `main`).
SERVE_CLI = """
import os, sys
os.environ["ENVIRONMENT_API_KEY"] = %(key)r
sys.argv = ["synth-deploy", "serve", %(app)r, "--port", "%(port)d", *%(flags)r]
from synth_deploy.cli import main
main()
"""

# The floor: Starlette on uvicorn's fast path. ``%(work)s``: what a rollout does besides
# answering ("" here; bench/capacity.py sleeps like an LLM-bound episode).
BARE_SERVER = """
import asyncio, hmac, json, uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

async def rollout(request):
    if not hmac.compare_digest(request.headers.get("x-api-key", "").encode(), b"%(key)s"):
        return JSONResponse({"detail": "forbidden"}, 403)
    body = json.loads(await request.body())
    %(work)s
    rewards = [1.0]
    return JSONResponse({"run_id": body["run_id"], "metrics": {
        "episode_rewards": rewards, "reward_mean": 1.0, "episode_returns": rewards,
        "mean_return": 1.0, "num_steps": 1, "num_episodes": 1, "outcome_reward": None,
        "event_rewards": None, "outcome_score": None, "events_score": None, "details": {}},
        "trajectories": [], "branches": {}, "aborted": False, "trace": None,
        "trace_correlation_id": None, "inference_url": None, "pipeline_metadata": {}})

async def alive(request):
    return JSONResponse({"ok": True})

uvicorn.run(Starlette(routes=[Route("/rollout", rollout, methods=["POST"]), Route("/", alive)]),
            host="127.0.0.1", port=%(port)d, log_level="warning", access_log=False,
            http="httptools", loop="uvloop", backlog=4096)
"""

# The bare endpoint, checking the request and the response with the protocol's models.
CHECKED_SERVER = """
import hmac, uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from synth_deploy.taskapp import RolloutRequest
from synth_deploy.taskapp.contracts import RolloutResponse

REQUEST = RolloutRequest.__pydantic_validator__
RESPONSE = RolloutResponse.__pydantic_validator__

async def rollout(request):
    if not hmac.compare_digest(request.headers.get("x-api-key", "").encode(), b"%(key)s"):
        return JSONResponse({"detail": "forbidden"}, 403)
    body = REQUEST.validate_json(await request.body())
    answer = RESPONSE.validate_python({"run_id": body.run_id, "metrics": {
        "episode_rewards": [1.0], "num_steps": 1}})
    return Response(answer.__pydantic_serializer__.to_json(answer),
                    media_type="application/json")

uvicorn.run(Starlette(routes=[Route("/rollout", rollout, methods=["POST"])]), host="127.0.0.1",
            port=%(port)d, log_level="warning", access_log=False, http="httptools",
            loop="uvloop")
"""

BODY = {"run_id": "bench", "env": {"seed": 1, "config": {}}, "policy": {"policy_name": "p",
        "config": {"model": "m", "inference_url": "http://127.0.0.1:1/v1"}},
        "record": {"return_trace": False}, "mode": "rl", "safety": {"max_time_s": 60}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--pairs", type=int, default=3, help="server sets, each started afresh")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per set")
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()

    body = json.dumps(BODY).encode()

    def client(url, bodies, key, *, seconds, concurrency):
        return wrk_load(url, body, key, seconds=seconds, concurrency=concurrency)

    with tempfile.TemporaryDirectory() as tmp:
        app = Path(tmp) / "trivial_app.py"
        app.write_text(TRIVIAL_APP)
        db = str(Path(tmp) / "traces.db")
        results = rounds_on_fresh_servers(
            {"serve": partial(child_server, SERVE_CLI, app=str(app), key=KEY, quiet=True,
                              flags=["--no-trace"]),
             "traced": partial(child_server, SERVE_CLI, app=str(app), key=KEY, quiet=True,
                               flags=["--trace-db", db]),
             "bare": partial(child_server, BARE_SERVER, key=KEY, work=""),
             "checked": partial(child_server, CHECKED_SERVER, ready_path="/rollout", key=KEY)},
            fixed_body(BODY), KEY, pairs=args.pairs, rounds=args.rounds,
            seconds=args.seconds, concurrency=args.concurrency, client=client)
    print(f"trivial rollout, {args.pairs} fresh sets of servers x {args.rounds} rounds of "
          f"{args.seconds:g}s, wrk with {args.concurrency} connections; body "
          f"{len(body)} bytes")
    print_rounds(results)
    print_ratios(results, (("serve", "bare", ">= 0.90x"), ("traced", "serve", ">= 0.80x"),
                           ("checked", "bare", None), ("serve", "checked", None)),
                 rate="throughput", cpu="server CPU per request")
    # Where tracing's CPU goes: the server's own process, and its writer child, which on a
    # machine of two cores shares them with the load generator.
    own = paired_cpu_ratio(results, "traced", "serve", own=True)
    writer = [r.cpu_us - r.own_cpu_us for r in results["traced"]
              if r.cpu_us is not None and r.own_cpu_us is not None]
    if own is not None and writer:
        print(f"traced/serve, the server process alone: CPU per request {own:.2f}x; its "
              f"writer child: {statistics.median(writer):.0f} µs per request")


if __name__ == "__main__":
    main()
