"""Long episodes at linear cost: a stored trace grows with its turns, not their square.

    python bench/long_episodes.py [--short 50] [--long 500] [--runs 3]

bytes per turn: an environment that never says done, capped at N turns, whose observation is
~180 characters, played by `smoke` through the mock policy (one episode, its trace in a fresh
SQLite file, measured after a checkpoint). The long episode's bytes per turn against the
short one's. Target: <= 1.2x.

write rate: sessions of 200 turns and of 5 turns (recorded as `call_policy` records them, the
policy's wire bytes, then expanded by the writer) written to a store one at a time; turns
written per second of each, and the ratio. Each figure is also printed as the store's
messages rows per turn.

reading a finished episode: an async rollout of ``--read-turns`` (200) policy calls, each
recorded with its prompt's token ids (the turn before's and more), asked for its trace, on
`synth-deploy serve APP` with its defaults; once it has finished, the median time to GET its
document (tens of MB), against the floor: bare Starlette on uvicorn answering the same bytes,
encoded beforehand. What `serve` adds is the document's encoding on its event loop, where every
other rollout of the server waits for it.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

APP = '''
from synth_deploy.taskapp import Step, TaskApp, function_tool

task_app = TaskApp("{app_id}", name="Endless", description="Walk a corridor without end.")

@task_app.environment(max_turns={turns})
class Endless:
    tool = function_tool("walk", "Walk on.", {{"type": "object", "properties": {{
        "steps": {{"type": "integer", "minimum": 1, "maximum": 3}}}}}})

    def reset(self, seed, *, episode_id, config):
        self.at = 0
        return {{"text": self.view()}}

    def view(self):
        return (f"You are at cell {{self.at}} of a corridor that never ends. The walls are "
                "grey stone, a torch flickers ahead, and the floor is dusty. Walk on by calling "
                "the walk tool with a number of steps.")[:180]

    def step(self, action):
        self.at += int(action.get("steps", 1))
        return Step({{"text": self.view()}}, reward=0.01)
'''


def stored_bytes(turns: int, folder: Path) -> tuple[int, int]:
    """(file bytes, messages rows) of one `turns`-turn episode smoked into a fresh file."""
    from synth_deploy.env import Env
    from synth_deploy.runs import RunOptions, run_suite
    from synth_deploy.tracing import parse_trace_db

    app = folder / f"endless_{turns}.py"
    app_id = f"endless-{turns}-{folder.name[-6:].lower()}"  # one id a file in this process
    app.write_text(APP.format(turns=turns, app_id=app_id))
    db = folder / f"endless_{turns}.db"
    report = run_suite(str(app), [0], Env(), options=RunOptions(max_time_s=600),
                       traces=parse_trace_db(str(db)))
    outcome = report.outcomes[0]
    if not outcome.ok or outcome.details.get("turn_cap") != turns:
        raise SystemExit(f"the {turns}-turn episode did not run to its cap: {outcome.error}")
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        messages = conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
    return db.stat().st_size, messages


def recorded_session(turns: int):
    """A finished session of ``turns`` policy calls, recorded as `call_policy` records them:
    each call's request (the whole conversation so far) and answer as wire bytes."""
    from synth_deploy.tracing import SessionTracer

    tracer = SessionTracer(metadata={"app_id": "endless", "status": "ok", "seed": 0})
    conversation = [{"role": "system", "content": "Walk a corridor without end."}]
    for turn in range(1, turns + 1):
        tracer.start_timestep(f"turn-{turn}", turn_number=turn)
        conversation.append({"role": "user", "content": f"You are at cell {turn}. " * 8})
        request = {"model": "mock", "messages": conversation,
                   "tools": [{"type": "function", "function": {"name": "walk"}}]}
        reply = {"role": "assistant", "content": None, "tool_calls": [{
            "id": f"c{turn}", "type": "function",
            "function": {"name": "walk", "arguments": '{"steps": 1}'}}]}
        answer = {"choices": [{"message": reply}], "usage": {
            "prompt_tokens": 10 * turn, "completion_tokens": 9, "total_tokens": 10 * turn + 9}}
        event = tracer.record_lm_call(model_name="mock", usage=answer["usage"])
        tracer.record_exchange(event, json.dumps(request).encode(), json.dumps(answer).encode())
        tracer.record_environment_event(reward=0.01)
        conversation = [*conversation, reply,
                        {"role": "tool", "tool_call_id": f"c{turn}", "content": "reward 0.01"}]
    return tracer.finish(expand=False)


def write_rate(turns: int, sessions: int, folder: Path) -> tuple[float, float]:
    """(turns written per second, messages rows per turn) writing ``sessions`` sessions."""
    from synth_deploy.tracing import open_trace_store

    db = folder / f"rate_{turns}.db"
    made = [recorded_session(turns) for _ in range(sessions)]
    with open_trace_store(str(db)) as store:
        started = time.perf_counter()
        for session in made:
            store.write_session_sync(session)
        elapsed = time.perf_counter() - started
    with sqlite3.connect(db) as conn:
        messages = conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
    return turns * sessions / elapsed, messages / (turns * sessions)


READ_APP = '''
import json
from synth_deploy.taskapp import TaskApp
from synth_deploy.tracing import TurnTokens

task_app = TaskApp("bench-long-read", name="Long read", description="A call a turn.")


@task_app.rollout
async def rollout(request, ctx):
    messages, prompt = [{"role": "system", "content": "Walk on."}], []
    for turn in range(request.env.config["turns"]):
        ctx.tracer.start_timestep(f"turn-{turn}", turn_number=turn)
        messages.append({"role": "user", "content": f"You are at cell {turn}. " * 6})
        prompt = [*prompt, *range(turn * 40, turn * 40 + 40)]
        event = ctx.tracer.record_lm_call(model_name="m", tokens=TurnTokens(
            prompt_ids=prompt, completion_ids=[7, 8, 9],
            completion_logprobs=[-0.1234567891234, -0.5, -1.0 / 3]))
        reply = {"role": "assistant", "content": f"I walk {turn}."}
        ctx.tracer.record_exchange(event, json.dumps({"model": "m", "messages": messages})
                                   .encode(), json.dumps({"choices": [{"message": reply}]})
                                   .encode())
        messages = [*messages, reply]
    return {"run_id": request.run_id, "metrics": {"outcome_reward": 1.0}}
'''

BARE_DOCUMENT = """
import uvicorn
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route
body = open(%(path)r, "rb").read()
async def document(request):
    return Response(body, media_type="application/json")
uvicorn.run(Starlette(routes=[Route("/", document)]), host="127.0.0.1", port=%(port)d,
            log_level="warning", access_log=False)
"""


def read_times(turns: int, reads: int, folder: Path) -> tuple[float, float, float]:
    """(serve's median read in s, the floor's, the document's MB) for a finished async
    rollout of ``turns`` calls."""
    import httpx
    from _harness import child_server
    from server_overhead import KEY, SERVE_CLI

    def timed(client: httpx.Client, url: str) -> tuple[float, bytes]:
        times, body = [], b""
        for _ in range(reads):
            started = time.perf_counter()
            body = client.get(url).raise_for_status().content
            times.append(time.perf_counter() - started)
        return statistics.median(times), body

    app = folder / "long_read_app.py"
    app.write_text(READ_APP)
    submitted = {"rollout_id": "long-read", "seed": 1, "submission_mode": "async",
                 "env": {"config": {"turns": turns}}, "record": {"return_trace": True},
                 "policy": {"model": "m", "inference_url": "http://127.0.0.1:9/v1"}}
    with httpx.Client(timeout=300, headers={"X-API-Key": KEY}) as client:
        with child_server(SERVE_CLI, app=str(app), key=KEY, quiet=True,
                          flags=["--trace-db", str(folder / "read.db")]) as url:
            client.post(url + "/containers/rollouts", json=submitted).raise_for_status()
            document = url + "/containers/rollouts/long-read"
            while client.get(document).json()["status"] == "running":
                time.sleep(0.2)
            served, body = timed(client, document)
        (folder / "document.json").write_bytes(body)
        with child_server(BARE_DOCUMENT, path=str(folder / "document.json")) as url:
            floor, _ = timed(client, url)
    return served, floor, len(body) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--short", type=int, default=50)
    parser.add_argument("--long", type=int, default=500)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--read-turns", type=int, default=200)
    parser.add_argument("--reads", type=int, default=5)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    ratios, rates, reads = [], [], []
    for run in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            short, short_msgs = stored_bytes(args.short, folder)
            long, long_msgs = stored_bytes(args.long, folder)
            per_short, per_long = short / args.short, long / args.long
            ratios.append(per_long / per_short)
            print(f"run {run}: {args.short} turns {per_short / 1024:.1f} KB/turn "
                  f"({short_msgs / args.short:.1f} messages rows/turn) · {args.long} turns "
                  f"{per_long / 1024:.1f} KB/turn ({long_msgs / args.long:.1f} rows/turn) · "
                  f"{ratios[-1]:.2f}x")
            long_rate, long_rows = write_rate(200, 5, folder)
            short_rate, short_rows = write_rate(5, 200, folder)
            rates.append(long_rate / short_rate)
            print(f"        write rate: 200-turn sessions {long_rate:,.0f} turns/s "
                  f"({long_rows:.1f} rows/turn) · 5-turn sessions {short_rate:,.0f} turns/s "
                  f"({short_rows:.1f} rows/turn) · {rates[-1]:.2f}x")
            served, floor, size = read_times(args.read_turns, args.reads, folder)
            reads.append(served / floor)
            print(f"        reading a finished {args.read_turns}-turn episode ({size:.1f} MB): "
                  f"serve {served * 1000:,.0f} ms · floor {floor * 1000:,.0f} ms · "
                  f"{reads[-1]:.2f}x")
    verdict = "ok" if max(ratios) <= 1.2 else "OVER TARGET"
    print(f"bytes per turn, {args.long} vs {args.short} turns: "
          f"{', '.join(f'{r:.2f}x' for r in ratios)} (target <= 1.2x: {verdict})")
    print(f"write rate in turns/s, 200-turn vs 5-turn sessions: "
          f"{', '.join(f'{r:.2f}x' for r in rates)} (median {statistics.median(rates):.2f}x)")
    print(f"reading a finished {args.read_turns}-turn episode, serve vs floor: "
          f"{', '.join(f'{r:.2f}x' for r in reads)} (median {statistics.median(reads):.2f}x)")


if __name__ == "__main__":
    main()
