"""Policy calls: an episode of five calls to an OpenAI-compatible policy, through
`synth-deploy serve APP` against the floor, bare Starlette on uvicorn's fast path (httptools +
uvloop) with one shared aiohttp session making the same calls.

A real episode is mostly policy calls (Crafter makes up to 40), so the cost of one call is
what a served app's capacity is made of. Each episode here sends five chat completions, the
conversation growing by the reply and a user turn each time, and answers a RolloutResponse.
The policy answers at once (a lean HTTP server on asyncio: the same fixed completion to every
call), so what is measured is the calling server.

The servers under test are pinned to core 0 (with what they start: `serve`'s trace writer);
the policy and wrk (32 connections) share core 1. "serve" is the CLI with its defaults
(traced, to a SQLite file); "untraced" adds `--no-trace`; "bare" is the floor. Rounds
alternate within one run and the ratios are taken within a round, then the median; the
servers are started afresh ``--pairs`` times. Printed: episodes/s, p99, and the CPU each
server spent per policy call; for `serve`, also what its writer child spent after each load
building the rows of the sessions it journaled meanwhile (each server is measured once the
one before has gone quiet). Target (issue 47): serve/bare >= 0.60x.

Then the held loop: ``--held-s`` (60) seconds of the same load on `serve` (defaults), and the
"held the event loop" warnings its log has: none for this LLM-bound episode; one, naming the
rollout, for a control app whose hundredth episode computes 0.3 s on the loop first.

Then the crowd: ``--in-flight`` episodes (1,000) at once, each on its own connection (the
openings spread over a second), against a policy that answers each call after
``--policy-s`` (1 s): errors and p50/p99 per server. Target: 0 errors, serve's p99 within 10%
of bare's.

    python bench/policy_calls.py [--pairs 2] [--rounds 2] [--seconds 3] [--held-s 60]
                                 [--in-flight 1000] [--skip-crowd]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import tempfile
from functools import partial
from pathlib import Path

from _harness import (
    child_server,
    fixed_body,
    latency_summary,
    post_rollout,
    print_cpu_split,
    print_ratios,
    print_rounds,
    rounds_on_fresh_servers,
    wrk_load,
)
from server_overhead import KEY, SERVE_CLI

CALLS = 5
SERVER_CORE, CLIENT_CORE = 0, 1
PIN = ["taskset", "-c", str(SERVER_CORE)]

# The policy: a fixed chat completion to every POST, after ``%(delay)r`` seconds, over
# keep-alive HTTP/1.1 on asyncio + uvloop (a framework would be the bottleneck of this bench).
POLICY = r"""
import asyncio, json, uvloop

ANSWER = json.dumps({"id": "c", "object": "chat.completion", "model": "m", "choices": [
    {"index": 0, "finish_reason": "stop", "message": {"role": "assistant",
     "content": "I move north."}}], "usage": {"prompt_tokens": 12, "completion_tokens": 4,
     "total_tokens": 16}}).encode()
REPLY = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %%d\r\n\r\n"
         %% len(ANSWER)) + ANSWER
DELAY = %(delay)r

class Policy(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.buffer = transport, b""

    def data_received(self, data):
        self.buffer += data
        while True:
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            length = 0
            for line in self.buffer[:head_end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            end = head_end + 4 + length
            if len(self.buffer) < end:
                return
            request_line, self.buffer = self.buffer[:8], self.buffer[end:]
            if DELAY and not request_line.startswith(b"GET"):  # GET: the bench asks if up
                asyncio.get_running_loop().call_later(DELAY, self.answer)
            else:
                self.transport.write(REPLY)

    def answer(self):
        if not self.transport.is_closing():
            self.transport.write(REPLY)

async def main():
    server = await asyncio.get_running_loop().create_server(
        Policy, "127.0.0.1", %(port)d, backlog=4096)
    await server.serve_forever()

uvloop.run(main())
"""

# The served app: five policy calls through the kit's `call_policy`.
APP = '''
from synth_deploy.taskapp import TaskApp, call_policy

task_app = TaskApp("bench-policy", name="policy calls", description="five policy calls")
EPISODES = []


@task_app.rollout
async def rollout(request, ctx):%(before)s
    messages = [{"role": "system", "content": "You play a game."},
                {"role": "user", "content": "You see a tree. What do you do?"}]
    for turn in range(%(calls)d):
        reply = await call_policy(ctx, messages)
        messages = [*messages, reply.message, {"role": "user", "content": f"turn {turn}"}]
    return {"run_id": request.run_id, "metrics": {"episode_rewards": [1.0],
                                                   "num_steps": %(calls)d}}
'''

# The held-loop control: one episode (the hundredth) computes on the loop before its calls.
HOLD = '''
    import time
    EPISODES.append(None)
    if len(EPISODES) == 100:
        started = time.thread_time()
        while time.thread_time() - started < 0.3:
            pass'''
HELD = "held the event loop"

# The floor: the same five calls from a Starlette route with one shared aiohttp session.
BARE = """
import hmac, json, aiohttp, uvicorn
from contextlib import asynccontextmanager
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

@asynccontextmanager
async def lifespan(app):
    app.state.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    yield
    await app.state.session.close()

async def rollout(request):
    if not hmac.compare_digest(request.headers.get("x-api-key", "").encode(), b"%(key)s"):
        return JSONResponse({"detail": "forbidden"}, 403)
    body = json.loads(await request.body())
    config = body["policy"]["config"]
    url = config["inference_url"].rstrip("/") + "/chat/completions"
    messages = [{"role": "system", "content": "You play a game."},
                {"role": "user", "content": "You see a tree. What do you do?"}]
    for turn in range(%(calls)d):
        async with request.app.state.session.post(
                url, json={"model": config["model"], "messages": messages}) as answer:
            reply = (await answer.json())["choices"][0]["message"]
        messages = [*messages, reply, {"role": "user", "content": f"turn {turn}"}]
    rewards = [1.0]
    return JSONResponse({"run_id": body["run_id"], "metrics": {
        "episode_rewards": rewards, "reward_mean": 1.0, "episode_returns": rewards,
        "mean_return": 1.0, "num_steps": %(calls)d, "num_episodes": 1, "outcome_reward": None,
        "event_rewards": None, "outcome_score": None, "events_score": None, "details": {}},
        "trajectories": [], "branches": {}, "aborted": False, "trace": None,
        "trace_correlation_id": None, "inference_url": None, "pipeline_metadata": {}})

async def alive(request):
    return JSONResponse({"ok": True})

uvicorn.run(Starlette(routes=[Route("/rollout", rollout, methods=["POST"]), Route("/", alive)],
                      lifespan=lifespan),
            host="127.0.0.1", port=%(port)d, log_level="warning", access_log=False,
            http="httptools", loop="uvloop", backlog=4096)
"""


def episode(inference_url: str, run_id: str = "bench") -> dict:
    return {"run_id": run_id, "env": {"seed": 1, "config": {}},
            "policy": {"policy_name": "p", "config": {"model": "m",
                                                      "inference_url": inference_url}},
            "record": {"return_trace": False}, "mode": "rl", "safety": {"max_time_s": 600}}


async def _crowd(url: str, n: int, inference_url: str) -> list[tuple[int | str, float]]:
    return await asyncio.gather(*(post_rollout(
        url, json.dumps(episode(inference_url, f"crowd-{i}")).encode(), KEY, delay=i / n)
        for i in range(n)))


def _rounds(servers: dict, policy: str, args: argparse.Namespace) -> None:
    """The paired rounds against the policy answering at once, and their ratios."""
    body = json.dumps(episode(policy + "/v1")).encode()

    def client(url, bodies, key, *, seconds, concurrency):
        return wrk_load(url, body, key, seconds=seconds, concurrency=concurrency)

    results = rounds_on_fresh_servers(
        servers, fixed_body(episode(policy + "/v1")), KEY, pairs=args.pairs,
        rounds=args.rounds, seconds=args.seconds, concurrency=args.concurrency, client=client)
    print(f"{CALLS}-call episodes, policy answering at once; {args.pairs} fresh sets x "
          f"{args.rounds} rounds of {args.seconds:g}s, wrk with {args.concurrency} "
          f"connections; servers on core {SERVER_CORE}, wrk and the policy on core "
          f"{CLIENT_CORE}")
    print_rounds(results)
    for name, rounds in results.items():
        per_call = [r.cpu_us / CALLS for r in rounds if r.cpu_us is not None]
        if per_call:
            print(f"{name}: CPU per policy call {statistics.median(per_call):.0f} µs "
                  f"(median over rounds, the server with its children)")
    print_cpu_split(results, "serve")
    print_ratios(results, (("serve", "bare", ">= 0.60x"), ("untraced", "bare", None)),
                 rate="episodes/s", cpu="CPU per policy call")


def _held_loop(tmp: Path, policy: str, *, seconds: float, concurrency: int) -> None:
    """The kit's held-loop warnings in `serve`'s log under wrk: none for the LLM-bound
    episode; one for the control, whose hundredth episode computes on the loop."""
    print(f"\nheld loop: {seconds:g}s of wrk ({concurrency} connections) on serve (defaults), "
          f"the policy answering at once; \"{HELD}\" warnings in serve's log")
    body = json.dumps(episode(policy + "/v1")).encode()
    for name, before in (("llm-bound", ""), ("control", HOLD)):
        app = tmp / f"held_{name.replace('-', '_')}.py"
        app.write_text(APP % {"calls": CALLS, "before": before})
        log = tmp / f"{app.stem}.log"
        with open(log, "w") as output, child_server(
                SERVE_CLI, app=str(app), key=KEY, wrapper=PIN, log_to=output,
                flags=["--trace-db", str(tmp / f"{app.stem}.db")]) as url:
            load = wrk_load(url, body, KEY, seconds=seconds, concurrency=concurrency)
        said = [line for line in log.read_text().splitlines() if HELD in line]
        target = "target 0" if not before else "target 1, naming rollout"
        print(f"  {name:>9}: {load.answered} episodes, {len(said)} warning(s) ({target})")
        for line in said[:3]:
            print(f"             {line[:200]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--pairs", type=int, default=2, help="server sets, each started afresh")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per set")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--in-flight", type=int, default=1000)
    parser.add_argument("--policy-s", type=float, default=1.0)
    parser.add_argument("--skip-crowd", action="store_true")
    parser.add_argument("--held-s", type=float, default=60.0,
                        help="seconds of load a held-loop count takes (0: skipped)")
    args = parser.parse_args()
    os.sched_setaffinity(0, {CLIENT_CORE})  # wrk and the policy; the servers get the other
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))

    with tempfile.TemporaryDirectory() as tmp:
        app = Path(tmp) / "policy_app.py"
        app.write_text(APP % {"calls": CALLS, "before": ""})
        db = str(Path(tmp) / "traces.db")
        servers = {
            "serve": partial(child_server, SERVE_CLI, app=str(app), key=KEY, quiet=True,
                             wrapper=PIN, flags=["--trace-db", db]),
            "untraced": partial(child_server, SERVE_CLI, app=str(app), key=KEY, quiet=True,
                                wrapper=PIN, flags=["--no-trace"]),
            "bare": partial(child_server, BARE, key=KEY, calls=CALLS, wrapper=PIN)}
        with child_server(POLICY, ready_path="/", delay=0, quiet=True) as policy:
            if args.pairs:
                _rounds(servers, policy, args)
            if args.held_s:
                _held_loop(Path(tmp), policy, seconds=args.held_s,
                           concurrency=args.concurrency)
        if args.skip_crowd:
            return
        print(f"\n{args.in_flight} episodes in flight, each call answered after "
              f"{args.policy_s:g}s ({CALLS} calls: {CALLS * args.policy_s:g}s an episode at "
              "best)")
        crowd: dict[str, dict] = {}
        with child_server(POLICY, ready_path="/", delay=args.policy_s, quiet=True) as slow:
            for name in ("serve", "bare"):
                with servers[name]() as url:
                    results_n = asyncio.run(_crowd(url, args.in_flight, slow + "/v1"))
                crowd[name] = latency_summary(results_n)
                s = crowd[name]
                print(f"  {name:>6}: {s['ok']} answered 200, errors {s['errors'] or 0}, "
                      f"p50 {s['p50']:.2f}s, p99 {s['p99']:.2f}s")
        print(f"serve/bare p99 {crowd['serve']['p99'] / crowd['bare']['p99']:.3f}x "
              "(target <= 1.10x, 0 errors)")


if __name__ == "__main__":
    main()
