"""Token capture's cost in the trace store: write throughput and bytes per session, with
token ids and logprobs against without, on sessions of 5 turns of 200 tokens each.

    python bench/token_traces.py [--sessions 400] [--rounds 3]

Both kinds of session record the same rollout (chat, LM call records with usage, an
environment reward a turn); the captured kind also holds each call's prompt ids,
completion ids and logprobs (each turn's prompt: the previous prompt and completion, then
200 new ids; its completion: 200 ids). Each round writes a fresh store of each kind through
the kit's writer process, as a served app does (32 rollouts in flight), without first, then
with, and times them; the ratio is taken within a round, and its median printed (target:
captured/plain throughput >= 0.80). Sizes are the files' after a checkpoint, and the token
table's own bytes, per session and per 1,000 tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from synth_deploy.tracing import SessionTrace, SessionTracer, TraceStore, TurnTokens, parse_trace_db

TURNS, TOKENS_PER_TURN = 5, 200
WORDS = ("tree", "stone", "water", "grass", "cow", "zombie", "table", "wood", "north", "east")


def episode(i: int, capture: bool) -> SessionTrace:
    rng = random.Random(i)
    tracer = SessionTracer(metadata={"app_id": "crafter", "run_id": f"bench-{i}", "seed": i,
                                     "model": "Qwen/Qwen3-4B", "status": "ok", "mode": "rl"})
    chat = [{"role": "system", "content": "You play Crafter. Call interact with actions."}]
    context: list[int] = []
    for turn in range(1, TURNS + 1):
        tracer.start_timestep(f"turn-{turn}", turn_number=turn)
        # About 200 tokens of text each: four characters a token.
        observation = " ".join(rng.choice(WORDS) for _ in range(TOKENS_PER_TURN))
        reply = {"role": "assistant", "content": " ".join(
            rng.choice(WORDS) for _ in range(TOKENS_PER_TURN))}
        chat.append({"role": "user", "content": observation})
        tracer.record_chat(chat)
        prompt = context + [rng.randrange(150_000) for _ in range(TOKENS_PER_TURN)]
        completion = [rng.randrange(150_000) for _ in range(TOKENS_PER_TURN)]
        tokens = TurnTokens(prompt, completion, [-rng.random() * 3 for _ in completion],
                            model="Qwen/Qwen3-4B") if capture else None
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(completion),
                 "total_tokens": len(prompt) + len(completion)}
        tracer.record_lm_call(model_name="Qwen/Qwen3-4B", provider="127.0.0.1", usage=usage,
                              latency_ms=900.0, tokens=tokens, call_records=[
                                  {"request": {"model": "Qwen/Qwen3-4B",
                                               "messages": list(chat)},
                                   "response": reply, "usage": usage}])
        chat.append(reply)
        tracer.record_chat(chat)
        tracer.record_environment_event(reward=float(turn % 2), terminated=turn == TURNS)
        context = prompt + completion
    tracer.record_outcome_reward(2.0)
    return tracer.finish()


async def _write(store: TraceStore, sessions: list[SessionTrace], in_flight: int) -> None:
    store.use_writer_process()  # as a served app's loop does
    queue = iter(sessions)

    async def worker() -> None:
        for session in queue:
            await store.write_session(session)

    await asyncio.gather(*(worker() for _ in range(in_flight)))


def write(path: Path, warm: list[SessionTrace], sessions: list[SessionTrace]) -> float:
    """Sessions/s for ``sessions`` into a fresh store at ``path`` (warmed by ``warm``)."""
    store = TraceStore(parse_trace_db(str(path)))
    try:
        asyncio.run(_write(store, warm, 32))
        started = time.perf_counter()
        asyncio.run(_write(store, sessions, 32))
        return len(sessions) / (time.perf_counter() - started)
    finally:
        store.close()


def sizes(path: Path) -> tuple[int, int, int]:
    """(file bytes after a checkpoint, token table bytes, sessions)."""
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        sessions = db.execute("SELECT COUNT(*) FROM session_traces").fetchone()[0]
        table = db.execute("SELECT COALESCE(SUM(pgsize), 0) FROM dbstat WHERE name = "
                           "'lm_call_tokens'").fetchone()[0]
    return path.stat().st_size, table, sessions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    n = args.sessions
    kinds = {"plain": [episode(i, False) for i in range(n + 50)],
             "captured": [episode(i, True) for i in range(n + 50)]}
    distinct = TURNS * 2 * TOKENS_PER_TURN  # ids an episode holds once concatenated
    per_call = sum(len(t.prompt_ids) + len(t.completion_ids)
                   for t in kinds["captured"][0].turn_tokens)
    print(f"{n} sessions of {TURNS} turns × {TOKENS_PER_TURN} tokens ({distinct} ids an "
          f"episode, {per_call} ids over its calls' prompts and completions), {args.rounds} "
          "round(s), 32 in flight, writer process")
    ratios, rates = [], {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for kind, sessions in kinds.items():
                path = Path(tmp) / f"{kind}-{r}.db"
                rates[kind].append(write(path, sessions[n:], sessions[:n]))
            ratios.append(rates["captured"][-1] / rates["plain"][-1])
            print(f"round {r + 1}: plain {rates['plain'][-1]:,.0f}/s · captured "
                  f"{rates['captured'][-1]:,.0f}/s · ratio {ratios[-1]:.2f}")
        plain_bytes, _, plain_n = sizes(Path(tmp) / "plain-0.db")
        cap_bytes, table, cap_n = sizes(Path(tmp) / "captured-0.db")
    per_plain, per_cap = plain_bytes / plain_n, cap_bytes / cap_n
    print(f"throughput captured/plain: median {statistics.median(ratios):.2f} "
          f"(target >= 0.80; rounds {', '.join(f'{x:.2f}' for x in ratios)})")
    print(f"bytes per session: plain {per_plain:,.0f} · captured {per_cap:,.0f} "
          f"({per_cap / per_plain:.2f}x)")
    print(f"token table: {table / cap_n:,.0f} bytes a session · "
          f"{table / cap_n / distinct * 1000:,.0f} bytes per 1,000 tokens "
          f"({(per_cap - per_plain) / distinct * 1000:,.0f} added to the file per 1,000)")


if __name__ == "__main__":
    main()
