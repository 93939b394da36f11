"""Durable async rollouts at scale: N 10-s rollouts on one core, each polled every 2 s, vs the
same N submitted synchronously (``POST /rollout``, held open for their 10 s).

The server is `synth-deploy serve APP` as users run it (traced to a SQLite file: the async
records live there too), pinned to core 0 with its writer child; the load client runs on
core 1. Async: each rollout submits ``POST /containers/rollouts`` (``submission_mode:
async``) on its own keep-alive connection, the submissions spread over the first second,
then polls it as the kit's clients do, a long poll (``?wait_ms=``, answered as soon as the
rollout ends) every ``--poll-s``: a pause of half of it, a wait of at most the other half.
Printed for each: rollouts done, errors (any status but 200/202, a connection dropped
twice), p50/p99 of a rollout from submission to the answer seen, and the server's CPU per
rollout (its process tree, from /proc); for async also polls, p50/p99 of a poll, and the
polling's cost: the async CPU per rollout minus the sync one, divided by the polls a rollout
made.

    python bench/async_rollouts.py [--n 4000] [--rollout-s 10] [--poll-s 2] [--runs 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _harness import child_server, post_rollout, server_pid, tree_cpu_s
from capacity import SLEEPY_APP, rollout_body
from server_overhead import KEY, SERVE_CLI

PIN = ["taskset", "-c", "0"]


def _http(host: str, port: int, method: str, path: str, body: bytes = b"") -> bytes:
    head = (f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nX-API-Key: {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = next(int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                  if line.startswith(b"content-length"))
    return status, await reader.readexactly(length)


async def _async_one(host: str, port: int, rollout_id: str, delay: float, poll_s: float,
                     polls: list[float], reconnects: list[str]) -> tuple[int | str, float]:
    await asyncio.sleep(delay)
    started = time.perf_counter()
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError as exc:
        return f"connect: {type(exc).__name__}", time.perf_counter() - started
    body = json.dumps({"rollout_id": rollout_id, "seed": 1, "submission_mode": "async",
                       "policy": {"model": "m", "inference_url": "http://127.0.0.1:1/v1"}}
                      ).encode()
    try:
        writer.write(_http(host, port, "POST", "/containers/rollouts", body))
        status, answer = await _answer(reader)
        if status != 202:
            return status, time.perf_counter() - started
        # As the kit's clients poll: a long poll (answered as soon as the rollout ends),
        # here half of each poll_s, after a pause of the other half.
        wait_ms = round(poll_s * 500)
        poll = _http(host, port, "GET", f"/containers/rollouts/{rollout_id}?wait_ms={wait_ms}")
        while True:
            await asyncio.sleep(poll_s / 2)
            asked = time.perf_counter()
            try:
                writer.write(poll)
                status, answer = await _answer(reader)
            except (OSError, asyncio.IncompleteReadError):
                # A kept-alive connection the server closed: a client connects again and
                # asks again (the rollout runs on regardless); once, then it is an error.
                reconnects.append(rollout_id)
                writer.close()
                reader, writer = await asyncio.open_connection(host, port)
                writer.write(poll)
                status, answer = await _answer(reader)
            polls.append(time.perf_counter() - asked)
            if status != 200:
                return status, time.perf_counter() - started
            document = json.loads(answer)
            if document["status"] != "running":
                done = 200 if document["status"] == "completed" else document["status"]
                return done, time.perf_counter() - started
    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
        return f"dropped: {type(exc).__name__}", time.perf_counter() - started
    finally:
        writer.close()


def _cuts(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return float("nan"), float("nan")
    cuts = statistics.quantiles(values, n=100)
    return cuts[49], cuts[98]


def _run(url: str, n: int, mode: str, poll_s: float) -> dict[str, object]:
    host, port = url.removeprefix("http://").split(":")
    polls: list[float] = []
    reconnects: list[str] = []
    pid = server_pid(url)
    before = tree_cpu_s(pid) if pid else None

    async def everyone():
        if mode == "sync":
            return await asyncio.gather(*(post_rollout(url, rollout_body(f"s-{i}"), KEY,
                                                       delay=i / n) for i in range(n)))
        return await asyncio.gather(*(_async_one(host, int(port), f"a-{i}", i / n, poll_s,
                                                 polls, reconnects) for i in range(n)))

    client_cpu = time.process_time()
    wall = time.perf_counter()
    results = asyncio.run(everyone())
    client_load = (time.process_time() - client_cpu) / (time.perf_counter() - wall)
    after = tree_cpu_s(pid) if pid else None
    ok = [seconds for status, seconds in results if status == 200]
    errors: dict[str, int] = {}
    for status, _ in results:
        if status != 200:
            errors[str(status)] = errors.get(str(status), 0) + 1
    cpu = (after[1] - before[1]) if before and after else float("nan")
    return {"ok": len(ok), "errors": errors, "rollout": _cuts(ok), "cpu_per_rollout_ms":
            cpu / max(1, len(results)) * 1000, "polls": len(polls), "poll": _cuts(polls),
            "reconnects": len(reconnects), "client_load": client_load}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4000)
    parser.add_argument("--rollout-s", type=float, default=10.0)
    parser.add_argument("--poll-s", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--untraced", action="store_true",
                        help="serve with --no-trace: async records in memory only")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    os.sched_setaffinity(0, {1})  # the load client on core 1, the server on core 0
    print(f"{args.n} rollouts of {args.rollout_s:g}s, async polled every {args.poll_s:g}s, "
          f"vs sync; the {'untraced' if args.untraced else 'traced'} server pinned to core 0 "
          "(a shared machine: read the ratios)")
    print(f"{'run':>3} {'mode':>5} {'ok':>5} {'errors':>16} {'p50 s':>6} {'p99 s':>6} "
          f"{'CPU/rollout ms':>14} {'polls':>6} {'poll p50 ms':>11} {'poll p99 ms':>11}")
    with tempfile.TemporaryDirectory() as tmp:
        app = Path(tmp) / "sleepy.py"
        app.write_text(SLEEPY_APP % {"seconds": args.rollout_s})
        for run in range(1, args.runs + 1):
            found = {}
            for mode in ("sync", "async"):
                db = Path(tmp) / f"traces-{run}-{mode}.db"
                flags = ["--no-trace"] if args.untraced else ["--trace-db", str(db)]
                with child_server(SERVE_CLI, wrapper=PIN, quiet=True, app=str(app), key=KEY,
                                  flags=flags) as url:
                    found[mode] = result = _run(url, args.n, mode, args.poll_s)
                errors = ", ".join(f"{v}x {k}" for k, v in result["errors"].items()) or "0"
                p50, p99 = result["rollout"]
                poll50, poll99 = result["poll"]
                print(f"{run:>3} {mode:>5} {result['ok']:>5} {errors:>16} {p50:>6.2f} "
                      f"{p99:>6.2f} {result['cpu_per_rollout_ms']:>14.3f} "
                      f"{result['polls'] if mode == 'async' else '':>6} "
                      f"{poll50 * 1000 if mode == 'async' else float('nan'):>11.2f} "
                      f"{poll99 * 1000 if mode == 'async' else float('nan'):>11.2f}",
                      flush=True)
            sync, durable = found["sync"], found["async"]
            per_rollout = durable["polls"] / max(1, args.n)
            extra = durable["cpu_per_rollout_ms"] - sync["cpu_per_rollout_ms"]
            print(f"    {durable['reconnects']} poll(s) asked again on a new connection "
                  "(the server had closed the kept-alive one); the load client's core busy "
                  f"{sync['client_load']:.0%} (sync), {durable['client_load']:.0%} (async)")
            print(f"    async/sync CPU per rollout {durable['cpu_per_rollout_ms'] / max(1e-9, sync['cpu_per_rollout_ms']):.2f}x; "  # noqa: E501
                  f"{per_rollout:.1f} polls a rollout, about {extra / per_rollout:.3f} ms "
                  "of server CPU each", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
