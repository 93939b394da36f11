"""What the live OTLP export costs a served task app, and what a receiver that is down costs.

    python bench/otlp_receiver_down.py [--seconds 3] [--rounds 7] [--concurrency 32] [--up]

The same app is served three ways, four with --up (`LocalRunner`, uvicorn, each in its own
process, each recording its rollouts in its own SQLite file as `serve` does by default, so
the export is all that differs), loaded by closed-loop clients in alternating rounds;
ratios are taken within a round against the server without an exporter, then the median
over rounds. OTEL_EXPORTER_OTLP_ENDPOINT names:

- refused: a port nobody listens on (connection refused, retried by the exporter);
- silent:  a receiver that accepts connections and never answers (a hung
           collector: each export waits for its timeout);
- up (--up): a receiver that answers 200 at once: what sending every rollout's spans costs
  (turning a session into spans and encoding them is about 0.4 ms of this process's time).

Each server also reports its own CPU time: CPU seconds per rollout against no exporter is
the cost least disturbed by whatever else the machine runs. Target for refused and silent:
throughput >= 0.90x, p99 <= 1.5x and CPU per rollout <= 1.10x of no exporter, and no rollout
fails. Apps: trivial (a rollout that returns at once: the export is all the work
there is) and math (the bundled app asking the kit's mock policy).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from _harness import LoadResult, child_server, free_port, load, paired_ratio, print_rounds
from trace_throughput import MOCK_POLICY, math_body, trivial_body

KEY = "sk_env_bench"

SERVE = """
import threading, time
from pathlib import Path
from synth_deploy.env import Env

def report_cpu(path=Path(%(cpu_file)r)):  # this process's CPU seconds, for the bench
    while True:
        path.write_text(repr(time.process_time()))
        time.sleep(0.05)

threading.Thread(target=report_cpu, daemon=True).start()
from synth_deploy.serving import LocalRunner, ServeSettings, ServerKeys
from synth_deploy.tracing import parse_trace_db
endpoint = %(endpoint)r
env = Env({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_TIMEOUT": "2"}
          if endpoint else {})
LocalRunner(ServeSettings(app=%(app)r, env=env, keys=ServerKeys((%(key)r,), "bench"),
                          traces=parse_trace_db(%(db)r), port=%(port)d,
                          log_level="error")).serve_forever()
"""

# A receiver that takes every export at once (what a healthy collector does).
RECEIVER_UP = """
import uvicorn
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

async def traces(request):
    await request.body()
    return Response(b"", media_type="application/x-protobuf")

async def root(request):
    return Response(b"ok")

app = Starlette(routes=[Route("/v1/traces", traces, methods=["POST"]), Route("/", root)])
uvicorn.run(app, host="127.0.0.1", port=%(port)d, log_level="error", access_log=False)
"""

# Accepts connections, never answers; answers "/" so the harness sees it is up.
RECEIVER_SILENT = """
import socket, threading
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", %(port)d))
server.listen(256)
held = []

def serve(conn):
    data = conn.recv(65536)
    if data.startswith(b"GET / "):
        conn.sendall(b"HTTP/1.1 200 OK\\r\\ncontent-length: 2\\r\\nconnection: close\\r\\n\\r\\nok")
        conn.close()
    else:
        held.append(conn)  # never answered

while True:
    conn, _ = server.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""

TRIVIAL_APP = '''
from synth_deploy.taskapp import TaskApp

task_app = TaskApp("bench-trivial", name="trivial", description="returns at once")


@task_app.rollout
async def rollout(request, ctx):
    ctx.tracer.record_lm_call(model_name="m", input_tokens=20, output_tokens=5, latency_ms=1.0)
    return {"run_id": request.run_id, "metrics": {"episode_rewards": [1.0], "num_steps": 1}}
'''


def compare(name: str, app: str, bodies, up: str | None, silent: str, tmp: Path,
            args: argparse.Namespace) -> dict[str, tuple[float, float, float]]:
    endpoints = {"off": "", "refused": f"http://127.0.0.1:{free_port()}", "silent": silent}
    if up:
        endpoints["up"] = up
    cpu_files = {variant: tmp / f"{name}-{variant}.cpu" for variant in endpoints}
    results: dict[str, list[LoadResult]] = {variant: [] for variant in endpoints}
    cpu_per_rollout: dict[str, list[float]] = {variant: [] for variant in endpoints}
    with ExitStack() as stack:
        servers = {variant: stack.enter_context(child_server(
            SERVE, ready_path="/", app=app, key=KEY, endpoint=endpoint,
            cpu_file=str(cpu_files[variant]), db=str(tmp / f"{name}-{variant}.db")))
            for variant, endpoint in endpoints.items()}
        for url in servers.values():  # warm-up
            load(url, bodies, KEY, seconds=0.5, concurrency=args.concurrency)
        order = list(servers.items())
        for round_no in range(args.rounds):  # the order alternates, so drift hits all alike
            for variant, url in order if round_no % 2 == 0 else reversed(order):
                before = _cpu(cpu_files[variant])
                result = load(url, bodies, KEY, seconds=args.seconds,
                              concurrency=args.concurrency)
                results[variant].append(result)
                cpu_per_rollout[variant].append((_cpu(cpu_files[variant]) - before)
                                                / max(result.answered, 1))
    print(f"{name}: no exporter vs receiver {' / '.join(list(endpoints)[1:])}, {args.rounds} "
          f"rounds of {args.seconds:g}s, {args.concurrency} connections (any answer but 200 "
          "stops the bench)")
    print_rounds(results)
    ratios = {}
    for variant in list(endpoints)[1:]:
        rate, p99 = paired_ratio(results, variant, "off")
        cpu = statistics.median(v / o for v, o in zip(cpu_per_rollout[variant],
                                                     cpu_per_rollout["off"], strict=True))
        ratios[variant] = (rate, p99, cpu)
        print(f"  {variant:>8}/off  throughput {rate:5.2f}x   p99 {p99:5.2f}x   server CPU per "
              f"rollout {cpu:5.2f}x   ({sum(r.answered for r in results[variant])} rollouts, "
              "all answered 200)")
    return ratios


def _cpu(path: Path) -> float:
    """The server's CPU seconds so far, as it last wrote them (every 50 ms)."""
    time.sleep(0.12)  # let the server write a value taken after the last request
    return float(path.read_text() or 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--only", choices=("trivial", "math"))
    parser.add_argument("--up", action="store_true", help="also a receiver that is up")
    args = parser.parse_args()

    summary = []
    with tempfile.TemporaryDirectory() as tmp_name, ExitStack() as stack:
        up = stack.enter_context(child_server(RECEIVER_UP, ready_path="/")) if args.up else None
        silent = stack.enter_context(child_server(RECEIVER_SILENT, ready_path="/"))
        tmp = Path(tmp_name)
        runs = []
        if args.only in (None, "trivial"):
            app = tmp / "trivial_app.py"
            app.write_text(TRIVIAL_APP)
            runs.append(("trivial", str(app), trivial_body, None))
        if args.only in (None, "math"):
            runs.append(("math", "math", None, MOCK_POLICY))
        for name, app, bodies, policy_source in runs:
            if policy_source is None:
                ratios = compare(name, app, bodies, up, silent, tmp, args)
            else:
                with child_server(policy_source, ready_path="/") as policy:
                    ratios = compare(name, app, math_body(policy + "/v1"), up, silent, tmp,
                                     args)
            summary.append(f"{name}: " + ", ".join(
                f"{v} {r:.2f}x (p99 {p:.2f}x, CPU/rollout {c:.2f}x)"
                for v, (r, p, c) in ratios.items()))
    print("summary (targets for refused/silent: >= 0.90x, p99 <= 1.5x, CPU <= 1.10x): "
          + "; ".join(summary))


if __name__ == "__main__":
    sys.exit(main())
