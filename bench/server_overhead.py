"""Server overhead: a trivial rollout through the kit vs a bare Starlette endpoint, untraced.

The kit's app is served as `synth-deploy serve` serves it (`LocalRunner`: `create_app`
under uvicorn); the bare one is a Starlette route under plain uvicorn doing the same JSON
work (check the key header, parse the request, answer a RolloutResponse-shaped body). Each
runs in its own process; they are loaded in alternating rounds within one run, so machine
noise hits both, and the ratios are taken within a round, then the median over rounds.
Rounds are short and many: this machine's speed drifts within seconds, and 15 rounds of 1 s
put three runs' ratios within 0.03 of each other where 5 rounds of 3 s spread over 0.10.
The servers are started afresh ``--pairs`` times (`rounds_on_fresh_servers`, as in
`trace_throughput.py`): with one pair for a whole run, runs ranged from 0.88x to 0.95x.
Targets: throughput kit/bare >= 0.90x, p99 kit/bare <= 1.30x.

A third server, "checked", is the bare endpoint validating the request and the response with
the protocol's own models (pydantic-core, as the kit does), so the run also says how much of
the gap is the price of checking the wire protocol and how much is the kit's. Instruction
counts cannot say it: `server_instructions.py` counts the kit and bare at the same number
per request, yet the kit takes more CPU time for them.

    python bench/server_overhead.py [--pairs 5] [--rounds 6] [--seconds 1] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from functools import partial
from pathlib import Path

from _harness import (
    child_server,
    fixed_body,
    paired_cpu_ratio,
    paired_ratio,
    print_rounds,
    rounds_on_fresh_servers,
)
from trace_throughput import SERVE, TRIVIAL_APP

KEY = "bench-key"

BARE_SERVER = """
import hmac, json, uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

async def rollout(request):
    if not hmac.compare_digest(request.headers.get("x-api-key", "").encode(), b"%(key)s"):
        return JSONResponse({"detail": "forbidden"}, 403)
    body = json.loads(await request.body())
    rewards = [1.0]
    return JSONResponse({"run_id": body["run_id"], "metrics": {
        "episode_rewards": rewards, "reward_mean": 1.0, "episode_returns": rewards,
        "mean_return": 1.0, "num_steps": 1, "num_episodes": 1, "outcome_reward": None,
        "event_rewards": None, "outcome_score": None, "events_score": None, "details": {}},
        "trajectories": [], "branches": {}, "aborted": False, "trace": None,
        "trace_correlation_id": None, "inference_url": None, "pipeline_metadata": {}})

uvicorn.run(Starlette(routes=[Route("/rollout", rollout, methods=["POST"])]), host="127.0.0.1",
            port=%(port)d, log_level="warning", access_log=False)
"""

# The bare endpoint, checking the request and the response with the protocol's models.
CHECKED_SERVER = """
import hmac, uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from synth_deploy.taskapp import RolloutRequest, RolloutResponse

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
            port=%(port)d, log_level="warning", access_log=False)
"""

BODY = {"run_id": "bench", "env": {"seed": 1, "config": {}}, "policy": {"policy_name": "p",
        "config": {"model": "m", "inference_url": "http://127.0.0.1:1/v1"}},
        "record": {"return_trace": False}, "mode": "rl", "safety": {"max_time_s": 60}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--pairs", type=int, default=5, help="server pairs, each started afresh")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per pair")
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        app = Path(tmp) / "trivial_app.py"
        app.write_text(TRIVIAL_APP)
        results = rounds_on_fresh_servers(
            {"kit": partial(child_server, SERVE, app=str(app), db="", key=KEY),
             "bare": partial(child_server, BARE_SERVER, ready_path="/rollout", key=KEY),
             "checked": partial(child_server, CHECKED_SERVER, ready_path="/rollout", key=KEY)},
            fixed_body(BODY), KEY, pairs=args.pairs, rounds=args.rounds,
            seconds=args.seconds, concurrency=args.concurrency)
    print(f"untraced trivial rollout, {args.pairs} fresh sets of servers x {args.rounds} "
          f"rounds of {args.seconds:g}s, {args.concurrency} connections; body "
          f"{len(json.dumps(BODY))} bytes")
    print_rounds(results)
    rate, p99 = paired_ratio(results, "kit", "bare")
    print(f"throughput kit/bare {rate:.2f}x (target >= 0.90x)   p99 kit/bare {p99:.2f}x "
          "(target <= 1.30x)")
    cpu = paired_cpu_ratio(results, "kit", "bare")
    if cpu is not None:
        print(f"server CPU per request kit/bare {cpu:.2f}x")
    for numerator, denominator in (("checked", "bare"), ("kit", "checked")):
        rate, p99 = paired_ratio(results, numerator, denominator)
        cpu = paired_cpu_ratio(results, numerator, denominator)
        print(f"  {numerator}/{denominator}: throughput {rate:.2f}x, p99 {p99:.2f}x"
              + (f", CPU per request {cpu:.2f}x" if cpu is not None else ""))


if __name__ == "__main__":
    main()
