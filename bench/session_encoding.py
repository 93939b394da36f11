"""What encoding a finished session costs the server's thread: a session log's record
(msgpack by msgspec: what a Modal container holds of each session, and what the kit sends
its writer child) against the standard library's pickle of the same session, in one run.

    python bench/session_encoding.py [--repeats 3] [--sessions 200]

Three sessions, each as `call_policy` records it (an LM call, then the bytes on the wire):
the five-call rollout of bench/volume_traces.py, a 20-turn episode whose policy returned
token ids (each prompt holds the one before: the log packs them), and a 60-turn chat
(each request holds the one before: past 64 KB, the log packs them too). Per session,
best of five passes, microseconds; ratio = record / pickle (lower is cheaper), and the
bytes of each. No target: it explains where bench/volume_traces.py's server CPU goes.
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path

from synth_deploy.tracing import (
    SessionLog,
    SessionTrace,
    SessionTracer,
    TurnTokens,
    read_session_log,
    write_session_log,
)


def episode(turns: int, *, tokens: bool, seed: int = 0) -> SessionTrace:
    tracer = SessionTracer(metadata={"app_id": "bench", "run_id": f"r{seed}", "seed": seed})
    messages = [{"role": "user", "content": f"seed {seed}"}]
    prompt: list[int] = list(range(100, 140))
    for turn in range(1, turns + 1):
        tracer.start_timestep(f"turn-{turn}", turn_number=turn)
        usage = {"prompt_tokens": len(prompt), "completion_tokens": 12,
                 "total_tokens": len(prompt) + 12}
        completion = list(range(turn * 1000, turn * 1000 + 12))
        event = tracer.record_lm_call(
            model_name="mock", provider="127.0.0.1", usage=usage, latency_ms=1.2,
            tokens=TurnTokens(list(prompt), completion, [-0.5] * 12, model="mock")
            if tokens else None)
        reply = {"role": "assistant", "content": "Working it out step by step.\nAnswer: 0"}
        tracer.record_exchange(
            event, json.dumps({"model": "mock", "messages": messages}).encode(),
            json.dumps({"id": f"c{turn}", "choices": [{"index": 0, "message": reply,
                                                       "finish_reason": "stop"}],
                        "usage": usage}).encode())
        messages = [*messages, reply, {"role": "user", "content": f"observation {turn}"}]
        prompt = prompt + completion + list(range(200, 210))
    tracer.record_outcome_reward(1.0)
    return tracer.finish(expand=False)


def per_session_us(encode, sessions: list) -> float:
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for session in sessions:
            encode(session)
        best = min(best, (time.perf_counter() - started) / len(sessions) * 1e6)
    return best


def pickled(session: SessionTrace) -> bytes:
    return pickle.dumps(session, pickle.HIGHEST_PROTOCOL)


def record(session: SessionTrace) -> bytes:
    log = SessionLog()
    log.append(session)
    [made] = log.take()
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=200)
    args = parser.parse_args()
    shapes = {"five calls": dict(turns=5, tokens=False),
              "20 turns, token ids": dict(turns=20, tokens=True),
              "60 turns of chat": dict(turns=60, tokens=False)}
    print(f"per session, best of 5 passes over {args.sessions} sessions; "
          f"{args.repeats} repeats")
    for name, shape in shapes.items():
        sessions = [episode(**shape, seed=i) for i in range(args.sessions)]
        first = sessions[0]
        with tempfile.TemporaryDirectory() as scratch:  # the records read back whole
            path = Path(scratch) / "check.log"
            write_session_log(path, [record(s) for s in sessions[:3]])
            assert [r[0] for r in read_session_log(path).records] == [
                s.session_id for s in sessions[:3]]
        ratios = []
        for repeat in range(1, args.repeats + 1):
            record_us = per_session_us(record, sessions)
            pickle_us = per_session_us(pickled, sessions)
            ratios.append(record_us / pickle_us)
            print(f"  {name:20s} run {repeat}: record {record_us:6.1f} µs, pickle "
                  f"{pickle_us:6.1f} µs, ratio {record_us / pickle_us:.2f}x")
        print(f"  {name:20s} bytes: record {len(record(first)):,}, pickle "
              f"{len(pickled(first)):,}; median ratio {statistics.median(ratios):.2f}x")

if __name__ == "__main__":
    sys.exit(main())
