"""Server memory after WebSocket sessions that each send one huge message (issue 50, item 3).

An app with an environment is served as `synth-deploy serve` serves it
(`LocalRunner.serve_forever()`, uvicorn's ws_max_size = the app's max_body_bytes, 4 MiB by
default; glibc keeps mapping large blocks apart, so they return to the system when freed),
and, as the baseline of the same run, the same app as the kit had it: uvicorn's own default
(16 MiB a message) and glibc's moving mmap threshold. Each server is in its own child
process.
Against each: ``--sessions`` WebSockets open at once, each resets an episode, then sends one
``--frame-mb`` text message and reads until the server answers or closes. The server's
resident memory (VmRSS from /proc) is read idle (after one warm-up session), at its peak
(VmHWM) and once every session has closed; the script prints after / idle per server.
Target: after <= 1.2x idle for the kit's server.

    python bench/websocket_memory.py [--sessions 80] [--frame-mb 15]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from _harness import free_port

KEY = "bench-key-0123456789"

APP = '''
from synth_deploy.taskapp import Step, TaskApp, function_tool


class Echo:
    tool = function_tool("say", "Say something.", {"type": "object"})

    def reset(self, seed, *, episode_id, config):
        return {"length": 0}

    def step(self, action):
        return Step({"length": len(str(action))}, reward=0.0, done=False)


task_app = TaskApp("wsmemory", name="bench", description="Echoes the size of an action.")
task_app.environment(Echo)
'''

SETTINGS = """
from synth_deploy.env import Env
from synth_deploy.serving import LocalRunner, ServerKeys, ServeSettings
settings = ServeSettings(app=%(app)r, env=Env(), keys=ServerKeys((%(key)r,), "bench"),
                         port=%(port)d, log_level="warning")
"""
KIT = SETTINGS + "LocalRunner(settings).serve_forever()\n"
# The same app and protocol as the kit had it: uvicorn's default message cap (16 MiB), and
# glibc's allocator as it comes (`prepare_serving_process` fixes its mmap threshold).
BEFORE = SETTINGS + """
import uvicorn
uvicorn.run(LocalRunner(settings).build(), host="127.0.0.1", port=%(port)d, ws="wsproto",
            log_level="warning")
"""


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise SystemExit(f"no {field} for {pid}")


def frame(payload: bytes) -> bytes:
    """A client's text frame, masked with a zero key (valid, and the payload stays as is)."""
    size = len(payload)
    if size < 126:
        head = struct.pack("!BB", 0x81, 0x80 | size)
    elif size < 1 << 16:
        head = struct.pack("!BBH", 0x81, 0x80 | 126, size)
    else:
        head = struct.pack("!BBQ", 0x81, 0x80 | 127, size)
    return head + b"\0\0\0\0" + payload


async def session(port: int, big: bytes) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        nonce = base64.b64encode(os.urandom(16)).decode()
        writer.write(("GET /openenv/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                      f"Connection: Upgrade\r\nSec-WebSocket-Key: {nonce}\r\n"
                      f"Sec-WebSocket-Version: 13\r\nX-API-Key: {KEY}\r\n\r\n").encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            return "refused"
        writer.write(frame(b'{"type": "reset", "data": {"seed": 1}}'))
        await asyncio.wait_for(reader.read(4096), 30)  # the first observation
        writer.write(big)
        try:
            await asyncio.wait_for(writer.drain(), 120)
            answer = await asyncio.wait_for(reader.read(4096), 120)
        except (TimeoutError, ConnectionError):
            return "closed"
        return "closed" if not answer or answer[:1] == b"\x88" else "answered"
    except (ConnectionError, asyncio.IncompleteReadError):
        return "closed"
    finally:
        writer.close()


async def sessions(port: int, count: int, frame_mb: float) -> dict[str, int]:
    pad = b"x" * int(frame_mb * 1024 * 1024)
    big = frame(b'{"type": "step", "data": {"pad": "' + pad + b'"}}')
    outcomes = await asyncio.gather(*(session(port, big) for _ in range(count)))
    return {o: outcomes.count(o) for o in set(outcomes)}


def measure(name: str, source: str, app: str, count: int, frame_mb: float) -> dict:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", source % {
        "app": app, "key": KEY, "port": port}])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except httpx.HTTPError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"{name}: the server did not start") from None
                time.sleep(0.05)
        asyncio.run(sessions(port, 1, 0.001))  # warm: the session path's imports and caches
        time.sleep(0.5)
        idle = rss_kib(proc.pid)
        outcomes = asyncio.run(sessions(port, count, frame_mb))
        closed_by = time.monotonic() + 120  # a loaded server may still be reading
        while httpx.get(f"http://127.0.0.1:{port}/openenv/health", timeout=10).json()[
                "capacity"]["active_sessions"] and time.monotonic() < closed_by:
            time.sleep(0.2)
        time.sleep(1.0)  # every session closed by the server: their buffers released
        after, peak = rss_kib(proc.pid), rss_kib(proc.pid, "VmHWM")
        return {"name": name, "idle": idle, "peak": peak, "after": after, "outcomes": outcomes}
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=80)
    parser.add_argument("--frame-mb", type=float, default=15.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        app = str(Path(folder) / "wsmemory_app.py")
        Path(app).write_text(APP)
        rows = [measure(name, source, app, args.sessions, args.frame_mb)
                for name, source in (("kit (ws_max_size = max_body_bytes)", KIT),
                                     ("baseline (uvicorn's 16 MiB)", BEFORE))]
    print(f"{args.sessions} sessions x {args.frame_mb:g} MB message; RSS in MiB")
    print(f"{'server':38} {'idle':>7} {'peak':>7} {'after':>7} {'after/idle':>10}  outcomes")
    for row in rows:
        print(f"{row['name']:38} {row['idle'] / 1024:7.0f} {row['peak'] / 1024:7.0f} "
              f"{row['after'] / 1024:7.0f} {row['after'] / row['idle']:9.2f}x  "
              f"{row['outcomes']}")
    kit = rows[0]
    verdict = "meets" if kit["after"] <= 1.2 * kit["idle"] else "misses"
    print(f"kit: after/idle {kit['after'] / kit['idle']:.2f}x ({verdict} the 1.2x target)")


if __name__ == "__main__":
    main()
