"""What the bench scripts share: servers in child processes and a closed-loop load client.

Each server runs under uvicorn in its own process (so it competes with the load generator
for CPU the way a deployed one competes with its clients, never for this process's GIL).
`load` is a raw keep-alive HTTP/1.1 client on asyncio streams: httpx would be the
bottleneck and hide the servers' difference. On Linux each load also reads, from /proc, the
CPU time its server spent per answered request (with its child processes, such as a trace
writer): steadier than throughput on a machine whose speed drifts from minute to minute.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

_SERVER_PIDS: dict[str, int] = {}  # URL -> the child process serving it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def child_server(source: str, *, ready_path: str = "/", wrapper: Sequence[str] = (),
                 start_timeout_s: float = 30, quiet: bool = False, log_to: IO[str] | None = None,
                 **values: object) -> Iterator[str]:
    """Run ``source % values`` (a script that serves on ``%(port)d``) and yield its URL;
    ``wrapper``: a command the interpreter runs under (valgrind); ``quiet``: its output
    dropped (a server that logs as users see it); ``log_to``: a file its output goes to."""
    port = free_port()
    output = log_to if log_to is not None else subprocess.DEVNULL if quiet else None
    proc = subprocess.Popen([*wrapper, sys.executable, "-c", source % {**values, "port": port}],
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=output,
                            stderr=output)
    url = f"http://127.0.0.1:{port}"
    _SERVER_PIDS[url] = proc.pid
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                httpx.get(url + ready_path, timeout=1)
                break
            except httpx.HTTPError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"server on {url} did not start") from None
                time.sleep(0.05)
        yield url
    finally:
        _SERVER_PIDS.pop(url, None)
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def server_pid(url: str) -> int | None:
    """The process serving ``url`` (a `child_server`), None when there is none."""
    return _SERVER_PIDS.get(url)


def tree_cpu_s(pid: int) -> tuple[float, float] | None:
    """User + system CPU seconds of ``pid`` alone, and of it with its descendants (None
    without /proc)."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except FileNotFoundError:
        return None
    for entry in entries:
        try:  # the fields after the command's closing parenthesis, from the 3rd on
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        parents[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    if pid not in cpu:
        return None
    tree, grew = {pid}, True
    while grew:
        children = {p for p, parent in parents.items() if parent in tree} - tree
        tree |= children
        grew = bool(children)
    return cpu[pid], sum(cpu[p] for p in tree)


@dataclass(frozen=True)
class LoadResult:
    rate: float  # requests per second
    p99_ms: float
    answered: int  # responses with status 200
    cpu_us: float | None = None  # the server's CPU per answered request (None: unknown)
    own_cpu_us: float | None = None  # of which its own process's (not its trace writer's)
    after_cpu_us: float | None = None  # what it spent per answered request once the load
    # stopped, until quiet (a trace writer building the rows of what it journaled)


async def _load(url: str, bodies: Callable[[int], bytes], key: str, seconds: float,
                concurrency: int) -> LoadResult:
    host, port = url.removeprefix("http://").split(":")
    head = (f"POST /rollout HTTP/1.1\r\nHost: {host}\r\nX-API-Key: {key}\r\n"
            "Content-Type: application/json\r\nContent-Length: ")
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds
    counter = iter(range(10**12))

    async def worker() -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while time.perf_counter() < stop_at:
                payload = bodies(next(counter))
                request = f"{head}{len(payload)}\r\n\r\n".encode() + payload
                t0 = time.perf_counter()
                writer.write(request)
                response_head = await reader.readuntil(b"\r\n\r\n")
                status = response_head.split(b" ", 2)[1]
                length = int(next(line.split(b":", 1)[1] for line in
                                  response_head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                body = await reader.readexactly(length)
                if status != b"200":
                    raise SystemExit(f"{url} answered {status.decode()}: {body[:300]!r}")
                latencies.append(time.perf_counter() - t0)
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    return LoadResult(len(latencies) / elapsed, statistics.quantiles(latencies, n=100)[98] * 1000,
                      len(latencies))


def load(url: str, bodies: Callable[[int], bytes], key: str, *, seconds: float,
         concurrency: int) -> LoadResult:
    """Throughput and p99 of ``concurrency`` closed-loop clients POSTing /rollout."""
    pid = server_pid(url)
    cpu_before = tree_cpu_s(pid) if pid else None
    result = asyncio.run(_load(url, bodies, key, seconds, concurrency))
    cpu_after = tree_cpu_s(pid) if pid else None
    return LoadResult(result.rate, result.p99_ms, result.answered,
                      *_per_request(cpu_before, cpu_after, result.answered, pid))


def _per_request(before: tuple[float, float] | None, after: tuple[float, float] | None,
                 answered: int, pid: int | None = None
                 ) -> tuple[float | None, float | None, float | None]:
    """(tree, own, after the load) CPU microseconds per answered request, from two
    `tree_cpu_s` readings and, with ``pid``, `settle`."""
    if before is None or after is None or not answered:
        return None, None, None
    later = settle(pid) if pid else None
    return ((after[1] - before[1]) / answered * 1e6, (after[0] - before[0]) / answered * 1e6,
            None if later is None else later / answered * 1e6)


def settle(pid: int, *, quiet_share: float = 0.05, every_s: float = 0.1,
           quiet_for_s: float = 0.5, timeout_s: float = 60.0) -> float | None:
    """Wait until ``pid`` and its children have used under ``quiet_share`` of a core for
    ``quiet_for_s`` on end; the CPU seconds they spent meanwhile. A server that defers work
    past its load (a trace writer building rows) would otherwise do it while the next
    server is measured. Quiet for one look is not enough: a trace writer waits a moment
    after the load (its server's recent CPU still says busy) before it starts building."""
    first = last = tree_cpu_s(pid)
    if first is None:
        return None
    deadline = time.monotonic() + timeout_s
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(every_s)
        now = tree_cpu_s(pid)
        if now is None:
            break
        busy, last = now[1] - last[1], now
        if busy >= quiet_share * every_s:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_for_s:
            break
    return last[1] - first[1]


_WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["X-API-Key"] = %s
wrk.body = %s
"""


def wrk_load(url: str, body: bytes, key: str, *, seconds: float, concurrency: int,
             threads: int = 1) -> LoadResult:
    """`load` by wrk (Debian's `wrk`): a C client, so that a fast server is not measured
    against the speed of a Python load generator. One body for every request."""
    import shutil
    import tempfile

    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install wrk")
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(_WRK_SCRIPT % (json.dumps(key), json.dumps(body.decode())))
    pid = server_pid(url)
    cpu_before = tree_cpu_s(pid) if pid else None
    try:
        out = subprocess.run(
            ["wrk", f"-t{threads}", f"-c{concurrency}", f"-d{max(1, round(seconds))}s",
             "--latency", "-s", script.name, url + "/rollout"],
            capture_output=True, text=True, timeout=seconds + 30, check=True).stdout
    finally:
        os.unlink(script.name)
    cpu_after = tree_cpu_s(pid) if pid else None
    if "Non-2xx" in out:
        raise SystemExit(f"{url} answered errors under load:\n{out}")
    rate = float(next(line.split()[1] for line in out.splitlines()
                      if line.startswith("Requests/sec")))
    p99 = next(line.split()[1] for line in out.splitlines() if line.strip().startswith("99%"))
    p99_ms = float(p99[:-2]) if p99.endswith("ms") else float(p99[:-2]) / 1000 \
        if p99.endswith("us") else float(p99[:-1]) * 1000
    answered = int(next(line.split()[0] for line in out.splitlines()
                        if "requests in" in line))
    return LoadResult(rate, p99_ms, answered,
                      *_per_request(cpu_before, cpu_after, answered, pid))


def fixed_body(body: dict) -> Callable[[int], bytes]:
    payload = json.dumps(body).encode()
    return lambda _: payload


def paired_rounds(servers: dict[str, str], bodies: Callable[[int], bytes], key: str, *,
                  rounds: int, seconds: float, concurrency: int,
                  client: Callable[..., LoadResult] | None = None
                  ) -> dict[str, list[LoadResult]]:
    """Load every server once per round, the order alternating, each after a short warm-up.

    The warm-up comes right before each measured load: a server left idle while the others
    were loaded has let its connections to the policy expire (3 s), and would otherwise pay
    for opening them again in whichever round follows a switch.
    """
    measure = client or load
    results: dict[str, list[LoadResult]] = {name: [] for name in servers}
    order = list(servers.items())
    for round_no in range(rounds):
        for name, url in order if round_no % 2 == 0 else reversed(order):
            load(url, bodies, key, seconds=0.5, concurrency=concurrency)
            results[name].append(measure(url, bodies, key, seconds=seconds,
                                         concurrency=concurrency))
    return results


def rounds_on_fresh_servers(start: dict[str, Callable[[], AbstractContextManager[str]]],
                            bodies: Callable[[int], bytes], key: str, *, pairs: int,
                            rounds: int, seconds: float, concurrency: int,
                            client: Callable[..., LoadResult] | None = None
                            ) -> dict[str, list[LoadResult]]:
    """`paired_rounds` on ``pairs`` sets of servers, each set started afresh (``start``: a
    name's server, as a context manager yielding its URL), the rounds of all sets together.

    A process's speed differs by a few percent from one start to the next (where its memory
    and hash tables fall): with one set for a whole run, that luck was the run's result.
    The servers start in turn, in alternating order: in one comparison of three traced
    servers, the one started later won by 0.04 to 0.09, whichever it was.
    """
    results: dict[str, list[LoadResult]] = {name: [] for name in start}
    for pair in range(pairs):
        starting = list(start.items()) if pair % 2 == 0 else list(reversed(start.items()))
        with ExitStack() as stack:
            urls = {name: stack.enter_context(begin()) for name, begin in starting}
            for name, measured in paired_rounds(urls, bodies, key, rounds=rounds,
                                                seconds=seconds, concurrency=concurrency,
                                                client=client).items():
                results[name] += measured
    return results


def paired_ratio(results: dict[str, list[LoadResult]], numerator: str, denominator: str
                 ) -> tuple[float, float]:
    """Median over rounds of the within-round throughput and p99 ratios."""
    pairs = list(zip(results[numerator], results[denominator], strict=True))
    return (statistics.median(n.rate / d.rate for n, d in pairs),
            statistics.median(n.p99_ms / d.p99_ms for n, d in pairs))


def paired_ratio_interval(results: dict[str, list[LoadResult]], numerator: str,
                          denominator: str, *, rounds: int, confidence: float = 0.95
                          ) -> tuple[float, float, float]:
    """The median of the sets' median within-round throughput ratios, and where it lies
    with ``confidence`` (low, high), from `rounds_on_fresh_servers`' results (``rounds``:
    each set's). A set's rounds share its
    processes' luck (where their memory fell: as large as the effects measured), so they
    are not independent draws; the sets are. The interval is the order statistics
    a binomial count puts around the median of the sets' medians (distribution-free): on a
    machine whose speed drifts, a run's ratio is one draw, and this says how far it may be
    from what many runs would give."""
    ratios = [n.rate / d.rate for n, d in
              zip(results[numerator], results[denominator], strict=True)]
    sets = sorted(statistics.median(ratios[i:i + rounds]) for i in range(0, len(ratios), rounds))
    n = len(sets)
    # The largest k with P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2.
    below, k = 0.0, 0
    while k < n // 2 and below + math.comb(n, k) / 2 ** n <= (1 - confidence) / 2:
        below += math.comb(n, k) / 2 ** n
        k += 1
    middle = statistics.median(sets)
    if k == 0:  # too few sets to say anything at this confidence
        return middle, sets[0], sets[-1]
    return middle, sets[k - 1], sets[n - k]


def paired_cpu_ratio(results: dict[str, list[LoadResult]], numerator: str,
                     denominator: str, *, own: bool = False) -> float | None:
    """Median over rounds of the within-round ratio of server CPU per request (``own``:
    the server process's alone, without its trace writer child)."""
    pairs = [(n.own_cpu_us, d.own_cpu_us) if own else (n.cpu_us, d.cpu_us)
             for n, d in zip(results[numerator], results[denominator], strict=True)]
    if any(n is None or d is None for n, d in pairs):
        return None
    return statistics.median(n / d for n, d in pairs)  # type: ignore[operator]


async def post_rollout(url: str, body: bytes, key: str | None, *, delay: float = 0.0
                       ) -> tuple[int | str, float]:
    """POST ``body`` to ``url``/rollout on a connection of its own, opened after ``delay``
    seconds: (its status, or what went wrong; seconds from connecting to its last byte)."""
    await asyncio.sleep(delay)
    host, port = url.removeprefix("http://").split(":")
    head = (f"POST /rollout HTTP/1.1\r\nHost: {host}:{port}\r\n"
            "Content-Type: application/json\r\n" + (f"X-API-Key: {key}\r\n" if key else "")
            + f"Content-Length: {len(body)}\r\n\r\n")
    started = time.perf_counter()
    try:
        reader, writer = await asyncio.open_connection(host, int(port))
    except OSError as exc:
        return f"connect: {type(exc).__name__}", time.perf_counter() - started
    try:
        writer.write(head.encode() + body)
        response = await reader.readuntil(b"\r\n\r\n")
        status = int(response.split(b" ", 2)[1])
        lines = response.lower().split(b"\r\n")
        if any(line.startswith(b"transfer-encoding: chunked") for line in lines):
            await reader.readuntil(b"0\r\n\r\n")
        else:
            await reader.readexactly(next(int(line.split(b":")[1]) for line in lines
                                          if line.startswith(b"content-length")))
        return status, time.perf_counter() - started
    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
        return f"dropped: {type(exc).__name__}", time.perf_counter() - started
    finally:
        writer.close()


def print_ratios(results: dict[str, list[LoadResult]],
                 comparisons: Sequence[tuple[str, str, str | None]], *, rate: str,
                 cpu: str) -> None:
    """A line per (numerator, denominator, target): the paired ratios of ``rate`` (what
    the throughput counts), p99 and ``cpu`` (what the CPU is per)."""
    for numerator, denominator, target in comparisons:
        rate_ratio, p99 = paired_ratio(results, numerator, denominator)
        cpu_ratio = paired_cpu_ratio(results, numerator, denominator)
        print(f"{numerator}/{denominator}: {rate} {rate_ratio:.2f}x"
              + (f" (target {target})" if target else "") + f", p99 {p99:.2f}x"
              + (f", {cpu} {cpu_ratio:.2f}x" if cpu_ratio is not None else ""))


def print_rounds(results: dict[str, list[LoadResult]]) -> None:
    """One line per round: each server's throughput, p99 and CPU per request (µs)."""
    names = list(results)
    widths = [max(13, len(n) + 8) for n in names]  # a long name keeps a space before it
    print("  round" + "".join(f"{n + ' req/s':>{w}}{'p99 ms':>9}{'cpu µs':>8}"
                              for n, w in zip(names, widths, strict=True)))
    for i in range(len(results[names[0]])):
        row = zip((results[n][i] for n in names), widths, strict=True)
        print(f"  {i + 1:>5}" + "".join(
            f"{r.rate:>{w}.0f}{r.p99_ms:>9.2f}"
            f"{'-' if r.cpu_us is None else format(r.cpu_us, '.0f'):>8}" for r, w in row))


def print_cpu_split(results: dict[str, list[LoadResult]], name: str) -> None:
    """Where ``name``'s CPU per request went: its server process and its children (the
    trace writer), medians over rounds."""
    rounds = [r for r in results[name] if r.cpu_us is not None and r.own_cpu_us is not None]
    if rounds:
        own = statistics.median(r.own_cpu_us for r in rounds)  # type: ignore[misc]
        children = statistics.median(r.cpu_us - r.own_cpu_us for r in rounds)  # type: ignore[operator]
        later = [r.after_cpu_us for r in rounds if r.after_cpu_us is not None]
        print(f"{name}: CPU per request {own:.0f} µs in the server, {children:.0f} µs in its "
              "children (the trace writer); medians over rounds"
              + (f"; after the load, {statistics.median(later):.0f} µs more (rows built "
                 "from the journal)" if later else ""))


def latency_summary(results: list[tuple[int | str, float]]) -> dict[str, object]:
    """(status, seconds) results as how many were 200, the other statuses counted, and
    the p50 and p99 seconds of the 200s."""
    ok = [seconds for status, seconds in results if status == 200]
    errors: dict[str, int] = {}
    for status, _ in results:
        if status != 200:
            errors[str(status)] = errors.get(str(status), 0) + 1
    cuts = statistics.quantiles(ok, n=100) if len(ok) >= 2 else [float("nan")] * 99
    return {"ok": len(ok), "errors": errors, "p50": cuts[49], "p99": cuts[98]}
