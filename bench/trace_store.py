"""The trace store as it grows: write rate, reads and SFT export at a million sessions.

    python bench/trace_store.py [--sessions 1000000] [--store PATH] [--measure 5000]

Builds its stores through the kit's own writer (`TraceStore.write_session` from a loop that
uses the writer process, as a served app does: group commit, the sessions a math rollout
records) and prints, measured in this run:

- write rate: sessions/s for ``--measure`` new sessions into a store holding 1k sessions and
  into the big one (target: the big store within 20% of the small one, ratio >= 0.80);
- `traces ls`, `traces stats`, `traces show` on the big store, as the CLI runs them (a new
  process each; target: each under 1 s);
- SFT export (`traces export`'s function) against a bare streaming join that writes the
  identical JSONL, on a 10k store and on the big one, twice each (join, export, export,
  join), with the store locked in memory: time ratio (target <= 1.3x) and the peak RSS of
  each (target: flat from 10k to the big store).

Generating a million sessions takes minutes; ``--store PATH`` keeps the big store there and
reuses it on the next run (it only grows to ``--sessions``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from synth_deploy.tracing import SessionTrace, SessionTracer, TraceStore, parse_trace_db

SYSTEM = "You solve arithmetic word problems. Think briefly, then end with 'Answer: N'."
REQUEST = {"env": {"env_id": None, "env_name": None, "config": {}}, "policy": {
    "policy_id": None, "policy_name": "bench", "config": {
        "model": "synth-deploy/mock-policy", "inference_url": "http://127.0.0.1:8/v1"}},
    "record": {"logprobs": False, "value": False, "return_trace": False},
    "safety": {"max_time_s": 120.0, "max_ops": None}, "mode": "rl"}


def math_session(i: int) -> SessionTrace:
    """What the math app and `call_policy` record for one rollout (one in 25 fails)."""
    a, b = i % 97 + 3, i % 89 + 2
    tracer = SessionTracer(metadata={"app_id": "math", "run_id": f"bench-{i}", "mode": "rl",
                                     "seed": i % 9000, "model": "synth-deploy/mock-policy"})
    tracer.start_timestep("turn-1", turn_number=1)
    chat = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"A baker makes {a} trays of {b} muffins. How many?"}]
    tracer.record_chat(chat)
    failed = i % 25 == 0
    if not failed:
        reply = {"role": "assistant", "content": f"{a} times {b}.\nAnswer: {a * b}"}
        usage = {"prompt_tokens": 41, "completion_tokens": 9, "total_tokens": 50}
        tracer.record_lm_call(model_name="synth-deploy/mock-policy", provider="127.0.0.1",
                              usage=usage, latency_ms=2.5, call_records=[
                                  {"request": {"model": "synth-deploy/mock-policy",
                                               "messages": chat}, "response": reply,
                                   "usage": usage}])
        tracer.record_chat([*chat, reply])
        correct = i % 3 != 0
        event = tracer.record_environment_event(reward=float(correct), terminated=True,
                                                state_after={"answer": a * b})
        tracer.record_event_reward(1.0, reward_type="answer_format", turn_number=1,
                                   event_id=event.id)
        tracer.record_outcome_reward(float(correct), achievements_count=int(correct))
    session = tracer.finish()
    session.metadata.update(duration_s=0.004, status="error" if failed else "ok",
                            request={**REQUEST, "run_id": f"bench-{i}"})
    if not failed:
        session.metadata["metrics"] = {"outcome_reward": float(i % 3 != 0), "num_steps": 1}
    return session


async def _write(store: TraceStore, first: int, count: int, in_flight: int) -> None:
    store.use_writer_process()  # as a served app's loop does
    numbers = iter(range(first, first + count))

    async def worker() -> None:
        for i in numbers:
            await store.write_session(math_session(i))

    await asyncio.gather(*(worker() for _ in range(in_flight)))


def count_sessions(path: Path) -> int:
    if not path.exists():
        return 0
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT COUNT(*) FROM session_traces").fetchone()[0]
    except sqlite3.Error:
        return 0
    finally:
        conn.close()


def grow(path: Path, target: int, *, report: bool = False) -> None:
    """Write sessions through the kit's writer until ``path`` holds ``target``."""
    have = count_sessions(path)
    if have >= target:
        return
    store = TraceStore(parse_trace_db(str(path)))
    started = time.perf_counter()
    step = 100_000
    try:
        for first in range(have, target, step):
            asyncio.run(_write(store, first, min(step, target - first), 256))
            if report:
                done = min(first + step, target) - have
                print(f"  generating: {first + min(step, target - first):>9,} sessions "
                      f"({done / (time.perf_counter() - started):,.0f}/s)", flush=True)
    finally:
        store.close()


def write_rate(path: Path, count: int) -> float:
    """Sessions/s for ``count`` more sessions into ``path`` (32 rollouts in flight)."""
    first = count_sessions(path) + 10_000_000  # run ids of their own
    store = TraceStore(parse_trace_db(str(path)))
    try:
        asyncio.run(_write(store, first, 200, 32))  # the writer process is up and warm
        started = time.perf_counter()
        asyncio.run(_write(store, first + 200, count, 32))
        return count / (time.perf_counter() - started)
    finally:
        store.close()


# Children cache their bytecode, as an installed package does.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def cli_seconds(*args: str) -> tuple[float, str]:
    """Median wall time of 3 runs of `synth-deploy traces ARGS` (after one to warm up)."""
    times, out = [], ""
    for attempt in range(4):
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "synth_deploy.cli", "traces", *args],
                              capture_output=True, text=True, timeout=300,
                              env={**ENV, "COLUMNS": "160"})
        if attempt:
            times.append(time.perf_counter() - started)
        if proc.returncode != 0:
            raise SystemExit(f"traces {' '.join(args)} failed: {proc.stderr}")
        out = proc.stdout
    return statistics.median(times), out


EXPORT = """
import sys, time
from synth_deploy.tracing import export_sft, open_trace_store
started = time.perf_counter()
with open_trace_store(sys.argv[1], read_only=True) as store:
    export_sft(store, sys.argv[2], overwrite=True)
print(time.perf_counter() - started)
"""

# The least any exporter must do to write this file: one streaming join over the messages,
# rows grouped as they come, and the LM calls of the same sessions, grouped by session and
# model in the same order, merged alongside; the same JSON (and `CostLedger`'s dict form for
# each rollout's ledger). It knows the generated data: no tools, no message metadata.
BARE_JOIN = """
import json, sqlite3, sys, time
from synth_deploy.tracing import CostLedger, ModelTokens
started = time.perf_counter()
encode = json.JSONEncoder(ensure_ascii=False).encode
conn = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
# CROSS JOIN keeps SQLite walking the sessions in order (an index), children by index seeks.
lm = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True).execute(
    "SELECT s.session_id, e.model_name, e.input_tokens, e.output_tokens, e.latency_ms, "
    "e.cost_usd FROM session_traces s CROSS JOIN events e WHERE e.session_id = s.session_id "
    "AND e.event_type = 'cais' AND s.status = 'ok' ORDER BY s.created_at, s.rowid")
rows = conn.execute(
    "SELECT s.session_id, json_extract(s.metadata, '$.app_id', '$.run_id', '$.seed', "
    "'$.model', '$.duration_s'), (SELECT o.total_reward FROM outcome_rewards o WHERE "
    "o.session_id = s.session_id ORDER BY o.id DESC LIMIT 1), t.id, t.step_id, "
    "t.turn_number, m.message_type, m.content FROM session_traces s CROSS JOIN "
    "session_timesteps t CROSS JOIN messages m WHERE t.session_id = s.session_id AND "
    "m.session_id = s.session_id AND m.timestep_id = t.id AND s.status = 'ok' "
    "ORDER BY s.created_at, s.rowid, t.step_index, t.id, m.id")
roles = {"system": "system", "user": "user", "assistant": "assistant"}
pending = next(lm, None)
ledger_of = {}

def ledger(sid, wall):
    global pending
    if sid not in ledger_of:
        ledger_of.clear()
        sums, calls, lm_s, cost = {}, 0, 0.0, None
        while pending is not None and pending[0] == sid:
            _, name, tin, tout, ms, usd = pending
            got = sums.setdefault(name or "(unknown model)", [0, 0])
            got[0] += tin or 0
            got[1] += tout or 0
            calls, lm_s = calls + 1, lm_s + (ms or 0.0) / 1000.0
            cost = cost if usd is None else (cost or 0.0) + usd
            pending = next(lm, None)
        models = {name: ModelTokens(*sums[name]) for name in sorted(sums)}
        wall = float(wall or 0.0)
        ledger_of[sid] = CostLedger(
            rollouts=1, lm_calls=calls, input_tokens=sum(t.input_tokens for t in models.values()),
            output_tokens=sum(t.output_tokens for t in models.values()), lm_s=lm_s,
            env_s=max(wall - lm_s, 0.0), wall_s=wall, by_model=models, cost_usd=cost).to_dict()
    return ledger_of[sid]

with open(sys.argv[2], "w", encoding="utf-8") as out:
    def flush(head, chat):
        last = max((i for i, m in enumerate(chat) if m["role"] == "assistant"), default=None)
        if last is None or not any(m["role"] != "assistant" for m in chat[:last]):
            return
        sid, fields, reward, step_id, turn = head
        app, run, seed, model, wall = json.loads(fields)
        out.write(encode({"messages": chat[:last + 1], "metadata": {
            "session_id": sid, "app_id": app, "run_id": run, "seed": seed, "model": model,
            "turn": turn, "step_id": step_id, "reward": reward,
            "ledger": ledger(sid, wall)}}) + "\\n")
    key, head, chat = None, None, []
    while batch := rows.fetchmany(2000):
        for sid, fields, reward, step, step_id, turn, kind, content in batch:
            if (sid, step) != key:
                if key is not None:
                    flush(head, chat)
                key, head, chat = (sid, step), (sid, fields, reward, step_id, turn), []
            chat.append({"role": roles[kind], "content": content})
    if key is not None:
        flush(head, chat)
print(time.perf_counter() - started)
"""


def timed_child(source: str, *args: str) -> tuple[float, float]:
    """Seconds of work (as the child timed it, imports aside) and peak RSS (MB) of
    ``source`` run in a new process."""
    proc = subprocess.Popen([sys.executable, "-c", source, *args], stdout=subprocess.PIPE,
                            text=True, env=ENV)
    assert proc.stdout is not None
    printed = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"child failed with status {status}")
    return float(printed.split()[-1]), usage.ru_maxrss / 1024


def sha(path: Path) -> str:
    # Streamed: a child's peak RSS counts the parent's memory it was forked from.
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


# Maps the file and locks it in memory (`mlock`), says whether that worked, and holds it
# until its stdin closes. A process of its own: a child forked from a process holding the
# mapping would count its 5 GB in the peak RSS the bench reports.
HOLD = """
import ctypes, mmap, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
fd = os.open(sys.argv[1], os.O_RDONLY)
size = os.fstat(fd).st_size
addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
locked = addr not in (None, ctypes.c_void_p(-1).value) and libc.mlock(addr, size) == 0
print("locked" if locked else "refused", flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def held_in_memory(path: Path) -> Iterator[bool]:
    """Keep ``path``'s pages in the page cache while the block runs, locked by a helper
    process. Yields False where locking is refused, having read the file once instead.

    Both sides of a comparison should read the file from memory. Reading it once was not
    enough here: this machine's kernel pages out what has not been touched for 6 s (DAMON,
    up to 128 MB/s), so each pass over the 5 GB store read much of it from disk again, and
    the 1M ratio moved between 1.18 and 1.37 over three runs of one commit.
    """
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdin is not None and holder.stdout is not None
    try:
        locked = holder.stdout.readline().strip() == "locked"
        if not locked:
            with path.open("rb") as fh:
                while fh.read(1 << 24):
                    pass
        yield locked
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)


def export_vs_join(db: Path, tmp: Path, label: str) -> tuple[float, float, float]:
    with held_in_memory(db) as locked:
        if not locked:
            print(f"  ({db.name}: could not lock it in memory; read once instead)")
        return _export_vs_join(db, tmp, label)


def _export_vs_join(db: Path, tmp: Path, label: str) -> tuple[float, float, float]:
    ours, bare = tmp / f"{label}-export.jsonl", tmp / f"{label}-join.jsonl"
    # Twice each, in the order join, export, export, join: the machine's speed drifts over
    # the minutes this takes, and one of each in one order moved the 1M ratio between 1.15
    # and 1.31 from run to run. The ratio is of the means.
    seconds: dict[str, list[float]] = {"join": [], "export": []}
    peak_mb = {"join": 0.0, "export": 0.0}
    digests, lines = set(), 0
    for which in ("join", "export", "export", "join"):
        out = bare if which == "join" else ours
        # Each from a clean slate: the previous one's gigabyte of output flushed to disk
        # first, so its writeback does not run during this one's timing.
        os.sync()
        took, mb = timed_child(BARE_JOIN if which == "join" else EXPORT, str(db), str(out))
        seconds[which].append(took)
        peak_mb[which] = max(peak_mb[which], mb)
        digests.add(sha(out))
        if which == "export":
            with out.open("rb") as fh:
                lines = sum(1 for _ in fh)
        out.unlink()
    export_s, join_s = statistics.mean(seconds["export"]), statistics.mean(seconds["join"])
    print(f"  {label:>5}: export {export_s:6.2f}s {peak_mb['export']:5.0f} MB   bare join "
          f"{join_s:6.2f}s {peak_mb['join']:5.0f} MB   ratio {export_s / join_s:4.2f}x   "
          f"{lines:,} examples, {'identical' if len(digests) == 1 else 'DIFFERENT'} files")
    if len(digests) != 1:
        raise SystemExit("the export and the bare join disagree")
    return export_s / join_s, peak_mb["export"], peak_mb["join"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1_000_000)
    parser.add_argument("--store", type=Path, help="keep (and reuse) the big store here")
    parser.add_argument("--measure", type=int, default=5000)
    args = parser.parse_args()
    big_label = f"{args.sessions // 1000:,}k"

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        big = args.store or tmp / "big.db"
        small, mid = tmp / "1k.db", tmp / "10k.db"
        grow(small, 1000)
        print(f"big store {big}: growing to {args.sessions:,} sessions through the kit's "
              "writer", flush=True)
        grow(big, args.sessions, report=True)
        grow(mid, 10_000)

        print(f"write rate ({args.measure:,} sessions, 32 in flight, 3 rounds; the 1k "
              "store is a fresh copy each round):")
        rates = []
        for round_no in range(3):
            fresh = tmp / f"1k-{round_no}.db"
            shutil.copyfile(small, fresh)
            small_rate = write_rate(fresh, args.measure)
            big_rate = write_rate(big, args.measure)
            rates.append(big_rate / small_rate)
            print(f"  at 1k: {small_rate:,.0f}/s   at {big_label}: {big_rate:,.0f}/s   "
                  f"ratio {rates[-1]:.2f}")
        write_ratio = statistics.median(rates)
        print(f"  median ratio {write_ratio:.2f}  (target >= 0.80)")

        print(f"reads on the {big_label} store (CLI, new process each, median of 3):")
        ls_s, listed = cli_seconds("ls", "--json", "-n", "20", "--trace-db", str(big))
        newest = json.loads(listed)[0]["session_id"]
        stats_s, _ = cli_seconds("stats", "--trace-db", str(big))
        show_s, _ = cli_seconds("show", newest[:16], "--trace-db", str(big))  # as ls prints
        start_s, _ = cli_seconds("--help")
        print(f"  traces ls {ls_s:.2f}s   stats {stats_s:.2f}s   show {show_s:.2f}s   "
              f"(target < 1 s each; `traces --help` alone {start_s:.2f}s)")

        print("SFT export vs a bare streaming join (new process each, join, export, export, "
              "join; mean time, peak RSS):")
        _, mid_mb, _ = export_vs_join(mid, tmp, "10k")
        ratio, big_mb, _ = export_vs_join(big, tmp, big_label)
        print(f"summary: write {write_ratio:.2f} (>= 0.80); ls {ls_s:.2f}s, stats "
              f"{stats_s:.2f}s, show {show_s:.2f}s (< 1 s); export/join {ratio:.2f}x (<= 1.3); "
              f"export RSS {mid_mb:.0f} MB at 10k, {big_mb:.0f} MB at {big_label}")
        for db in (small, mid, big):
            check = sqlite3.connect(db).execute("PRAGMA integrity_check").fetchone()[0]
            if check != "ok":
                raise SystemExit(f"{db}: integrity_check says {check}")
        print("integrity_check ok on every store")


if __name__ == "__main__":
    main()
