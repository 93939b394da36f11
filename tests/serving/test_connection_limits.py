"""Connections to the real served math app (uvicorn on 127.0.0.1): half-open and idle ones are
closed after their deadline, a server holding its maximum answers 503 at once, and a response
leaves in one send while a streamed one still goes out chunk by chunk."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route
from toy_apps import slow_async_rollout, toy_config

from synth_deploy.env import Env
from synth_deploy.serving import (
    BackgroundServer,
    ConnectionLimits,
    LocalRunner,
    ServeSettings,
    create_app,
    server_keys,
)

LIMITS = ConnectionLimits(max_connections=8, header_timeout_s=0.5, body_timeout_s=1.0,
                          keep_alive_s=5.0)

# Reads uvicorn's or aiohttp's internals the kit relies on: CI runs it on the newest releases too.
pytestmark = pytest.mark.upstream



@pytest.fixture(scope="module")
def runner():
    # One served app for the tests that each open, and close, their own connections.
    settings = ServeSettings(app="math", env=Env(), keys=server_keys(Env(), "ephemeral"),
                             limits=LIMITS)
    with LocalRunner(settings) as running:
        yield running


def connect(runner) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", int(runner.url.rsplit(":", 1)[1])),
                                    timeout=5)
    return sock


def closed_by_server(sock: socket.socket, within_s: float) -> bool:
    """True when the server closes ``sock`` (EOF or reset) within ``within_s``."""
    sock.settimeout(within_s)
    try:
        while sock.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def health(runner) -> httpx.Response:
    return httpx.get(runner.url + "/health", timeout=5,
                     headers={"X-API-Key": runner.settings.keys.primary})


def test_a_connection_that_sends_nothing_is_closed(runner):
    sock = connect(runner)
    started = time.monotonic()
    assert closed_by_server(sock, within_s=5)
    assert 0.4 < time.monotonic() - started < 3
    sock.close()


def test_headers_trickled_byte_by_byte_do_not_keep_a_connection(runner):
    sock = connect(runner)
    request = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100
    started = time.monotonic()
    sent = 0
    try:
        while time.monotonic() - started < 5:
            sock.send(request[sent:sent + 1])  # each byte resets uvicorn's own idle timer
            sent += 1
            time.sleep(0.1)
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert time.monotonic() - started < 3, "the server kept a trickling request open"
    sock.close()


def test_a_body_that_never_finishes_is_cut_off(runner):
    sock = connect(runner)
    sock.sendall(b"POST /rollout HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n{\"run_id\": ")
    started = time.monotonic()
    assert closed_by_server(sock, within_s=5)
    assert time.monotonic() - started < 3
    sock.close()


def test_a_full_server_answers_503_at_once_and_recovers():
    # Idle connections that live long enough for the server to have accepted them all,
    # however loaded the machine (the whole suite on two cores): it counts each as its loop
    # gets to it.
    limits = dataclasses.replace(LIMITS, header_timeout_s=5.0)
    settings = ServeSettings(app="math", env=Env(), keys=server_keys(Env(), "ephemeral"),
                             limits=limits)
    with LocalRunner(settings) as runner:
        idle = [connect(runner) for _ in range(limits.max_connections)]
        busy = answered_within(lambda: health(runner), 503, within_s=4.5)
        assert busy.json()["detail"]["error"]["code"] == "server_busy"
        assert busy.headers["retry-after"] == "1"
        # The idle ones are reaped at their header deadline; then the app serves again.
        assert all(closed_by_server(sock, within_s=8) for sock in idle)
        for sock in idle:
            sock.close()
        answered_within(lambda: health(runner), 200, within_s=2.0)


def answered_within(ask, status: int, within_s: float) -> httpx.Response:
    """``ask()`` until it answers ``status`` (each answer at once), or fail at ``within_s``."""
    deadline = time.monotonic() + within_s
    while True:
        started = time.monotonic()
        answer = ask()
        assert time.monotonic() - started < 2
        if answer.status_code == status or time.monotonic() > deadline:
            assert answer.status_code == status, answer.text
            return answer


def test_keep_alive_requests_and_a_slow_rollout_are_untouched(api_key):
    # The deadlines are on receiving a request, not on the app's answer: a rollout that takes
    # longer than both still completes, and a keep-alive client reuses its connection.
    app = create_app(toy_config(slow_async_rollout), api_keys=[api_key])
    with BackgroundServer(app, limits=LIMITS) as server, httpx.Client(
            timeout=10, headers={"X-API-Key": api_key}) as client:
        for n in range(3):
            resp = client.post(server.url + "/rollout", json={
                "run_id": f"k-{n}", "env": {"config": {"sleep": 1.2}}})
            assert resp.status_code == 200, resp.text
            time.sleep(0.3)


def test_an_idle_keep_alive_connection_is_closed_and_a_begun_request_keeps_its_deadline(
        api_key):
    limits = ConnectionLimits(header_timeout_s=1.5, body_timeout_s=5.0, keep_alive_s=0.5)
    app = create_app(toy_config(slow_async_rollout), api_keys=[api_key])
    request = f"GET /health HTTP/1.1\r\nHost: x\r\nX-API-Key: {api_key}\r\n\r\n".encode()
    with BackgroundServer(app, limits=limits) as server:
        port = int(server.url.rsplit(":", 1)[1])

        def answered_connection() -> tuple[socket.socket, float]:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(request)
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
            return sock, time.monotonic()

        idle, answered_at = answered_connection()
        assert closed_by_server(idle, within_s=3)
        # keep_alive_s (the server armed it a moment before the client read the answer)
        assert 0.45 <= time.monotonic() - answered_at < 1.2
        idle.close()

        # Past the keep-alive, a next request that has begun has until its header deadline
        # (counted from the previous response), not forever.
        begun, answered_at = answered_connection()
        time.sleep(0.2)
        begun.sendall(b"GET /health HTTP/1.1\r\nHost:")
        assert not closed_by_server(begun, within_s=0.6)
        assert closed_by_server(begun, within_s=3)
        assert 1.5 <= time.monotonic() - answered_at < 2.3
        begun.close()


_ONE_WRITE = """
import os, re, socket, sys
if os.environ.get("SYNTH_DEPLOY_TEST_FALLBACK") == "1":
    sys.modules["httptools"] = None; sys.modules["uvloop"] = None
import httpx
from synth_deploy.env import Env
from synth_deploy.serving import LocalRunner, ServeSettings, server_keys

def writes():  # write(2)-family calls: uvloop's writes, not asyncio's or the client's sends
    return int(re.search(r"syscw: (\\d+)", open("/proc/self/io").read()).group(1))

sent = []  # asyncio's sends from the server's socket
real_send = socket.socket.send
with LocalRunner(ServeSettings(app="math", env=Env(),
                               keys=server_keys(Env(), "ephemeral"))) as runner:
    port = int(runner.url.rsplit(":", 1)[1])
    def recording_send(sock, data, *flags):
        if sock.family == socket.AF_INET and sock.getsockname()[1] == port:
            sent.append(bytes(data))
        return real_send(sock, data, *flags)
    socket.socket.send = recording_send
    with httpx.Client(timeout=5, headers={"X-API-Key": runner.settings.keys.primary}) as c:
        c.get(runner.url + "/health")  # the connection is open before counting
        before, sent[:] = writes(), []
        for path in ("/health", "/task_info", "/info") * 10:  # none wakes a worker thread
            assert c.get(runner.url + path).status_code == 200
        print(writes() - before + len(sent))
"""


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux's /proc/self/io")
def test_a_response_leaves_the_server_in_one_write():
    # uvicorn alone writes the head and the body apart: two system calls, two segments,
    # two client wake-ups per response. Counted in a process of its own: nothing else
    # writes there.
    done = subprocess.run([sys.executable, "-c", _ONE_WRITE], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) == 30


def test_a_response_names_no_server_software_and_keeps_its_date(runner):
    resp = httpx.get(runner.url + "/health", timeout=5,
                     headers={"X-API-Key": runner.settings.keys.primary})
    assert resp.status_code == 200
    assert "server" not in resp.headers
    assert resp.headers["date"].endswith(" GMT")


def test_a_streamed_response_goes_out_chunk_by_chunk(serve):
    # The second chunk is made only once the client holds the first: were writes held until
    # the response ends, neither would arrive.
    first_arrived = threading.Event()

    async def chunks():
        yield b"first;"
        for _ in range(500):
            if first_arrived.is_set():
                break
            await asyncio.sleep(0.01)
        yield b"second"

    async def stream(request):
        return StreamingResponse(chunks())

    server = serve(Starlette(routes=[Route("/stream", stream)]))
    with httpx.stream("GET", server.url + "/stream", timeout=10) as resp:
        parts = resp.iter_raw()
        assert next(parts) == b"first;"
        first_arrived.set()
        assert b"".join(parts) == b"second"


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("SYNTH_DEPLOY_TEST_FALLBACK") == "1",
                    reason="already the fallback run")
def test_every_bound_holds_on_the_fallback_protocol_without_httptools_and_uvloop():
    # Where their wheels do not install, the kit serves on h11 + asyncio: the tests of this
    # module run again in a process where neither can be imported (that one process: the
    # suite's xdist workers would each import everything again for a handful of tests).
    script = ("import sys; sys.modules['httptools'] = None; sys.modules['uvloop'] = None\n"
              "import pytest; raise SystemExit(pytest.main(["
              f"{__file__!r}, '-q', '-n0', '-p', 'no:cacheprovider', '-W', 'ignore']))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).parents[1],
                          env={**os.environ, "SYNTH_DEPLOY_TEST_FALLBACK": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "1 skipped" in done.stdout, done.stdout[-500:]
