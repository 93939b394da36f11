"""OpenEnv's wire, judged by OpenEnv's own code, and measured against OpenEnv's own server.
Needs a venv with openenv and this kit; never run in CI (openenv brings gradio, fastmcp...):

    python -m venv /tmp/openenv10-venv && /tmp/openenv10-venv/bin/pip install openenv==0.10.0
    /tmp/openenv10-venv/bin/pip install -e .            # the kit, beside openenv
    /tmp/openenv10-venv/bin/pip install --no-deps --target /tmp/oe011 openenv-core==0.1.1
    /tmp/openenv10-venv/bin/python bench/openenv_wire.py [--core03 /tmp/openenv-venv/bin/python]

Prints one line per check (ok or FAIL) and the figures, exits 1 on any FAIL:

  validate   `openenv validate`'s checks pass against `synth-deploy serve math` and `crafter`
             (served with a key: the checks read only the public routes)
  ws         OpenEnv's GenericEnvClient (0.10, the key in its headers) plays N episodes of
             each app; each episode is in the trace store (status ok, its steps)
  http       openenv-core 0.1's HTTPEnvClient plays N episodes through /reset and /step
  core03     (--core03) openenv-core 0.3's validator and client (it sends no headers: against
             a --no-auth server)
  keyless    a keyless client is refused at the handshake; a client killed mid-episode leaves
             no session (the capacity /health advertises is back to 0)
  echo       `openenv init echo_env` (OpenEnv's template) declared with TaskApp.openenv: served,
             smoke-tested with the mock policy, dry-run deployed
  latency    WebSocket step latency and throughput, the same echo environment, OpenEnv's own
             server (uvicorn + websockets) against `synth-deploy serve`, each pinned to one core,
             clients on the other: 1, 64 and 256 sessions stepping back to back
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from synth_deploy.tracing import open_trace_store

ROOT = Path(__file__).resolve().parents[1]
SIDE = str(ROOT / "bench" / "_openenv_side.py")
KEY = "sk_env_openenv_bench"
LEGACY = "/tmp/oe011"
failures: list[str] = []


def report(name: str, ok: bool, detail: Any = "") -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' if detail else ''}{detail}", flush=True)
    if not ok:
        failures.append(name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def side(python: str, *args: str, timeout: float = 300, cpu: str | None = None) -> Any:
    """_openenv_side.py's JSON answer (``cpu``: pinned to that core, as `Served` is)."""
    out = subprocess.run([*(["taskset", "-c", cpu] if cpu else []), python, SIDE, *args],
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


class Served:
    """A child process serving on ``port`` until the block ends."""

    def __init__(self, command: list[str], port: int, health: str, env: dict | None = None,
                 cpu: str | None = None, cwd: str | None = None) -> None:
        self.command = (["taskset", "-c", cpu] if cpu else []) + command
        self.port, self.health, self.env, self.cwd = port, health, env, cwd

    def __enter__(self) -> str:
        # Its log goes to a file: a pipe nobody reads fills, and the server then blocks in
        # its next log line (a server logs each WebSocket it accepts).
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(self.command, env={**os.environ, **(self.env or {})},
                                     cwd=self.cwd, stdout=subprocess.DEVNULL,
                                     stderr=self.log, text=True)
        url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"{self.command} exited: {self.log.read()[-2000:]}")
            try:
                if httpx.get(url + self.health, timeout=2).status_code < 500:
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.command} did not start")

    def __exit__(self, *exc: Any) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(60)  # a server holding thousands of threads takes a while to go
        self.log.close()


def kit(app: str, port: int, db: Path | None = None, *extra: str, cpu: str | None = None,
        cwd: str | None = None) -> Served:
    trace = ["--trace-db", str(db)] if db else ["--no-trace"]
    return Served([str(Path(sys.executable).parent / "synth-deploy"), "serve", app, "--port",
                   str(port), *trace, *extra], port, "/openenv/health",
                  env={"ENVIRONMENT_API_KEY": KEY}, cpu=cpu, cwd=cwd)


ACTIONS = {"math": {"answer": 7}, "crafter": {"actions": ["move_left", "do"]}}


def judge_app(app: str, n: int, python: str, tmp: Path) -> None:
    db = tmp / f"{app}.db"
    with kit(app, free_port(), db) as url:
        base = url + "/openenv"
        verdict = side(python, "validate", base)
        failed = [c["id"] for c in verdict["criteria"] if not c["passed"]]
        report(f"validate {app}", verdict["passed"], failed or verdict["standard_profile"])
        ws = side(python, "episodes", base, "--episodes", str(n), "--key", KEY,
                  "--action", json.dumps(ACTIONS[app]), "--max-steps", "8")["episodes"]
        report(f"ws {app}", len(ws) == n and all(e["steps"] for e in ws),
               f"{n} episodes, steps {[e['steps'] for e in ws]}")
        http = side(python, "http-episodes", base, LEGACY, "--episodes", str(n), "--key", KEY,
                    "--action", json.dumps(ACTIONS[app]), "--max-steps", "8")["episodes"]
        report(f"http {app}", len(http) == n and all(e["steps"] for e in http),
               f"{n} episodes, steps {[e['steps'] for e in http]}")
        health = httpx.get(base + "/health", timeout=5).json()["capacity"]
    with open_trace_store(str(db)) as store:
        stored = store.list_sessions(app=app, limit=None)
    ended = [s for s in stored if s.status == "ok"]
    # An episode the client stopped before done is traced too, as unfinished (an error).
    report(f"traces {app}", len(stored) == 2 * n,
           f"{len(stored)} episodes stored ({len(ended)} done), sessions left open over "
           f"HTTP: {health['active_sessions']} (reaped after {health['idle_timeout_s']:g} s)")


def judge_core03(python: str) -> None:
    with kit("math", free_port(), None, "--no-auth") as url:
        verdict = side(python, "validate", url + "/openenv")
        report("core03 validate", verdict["passed"],
               [c["id"] for c in verdict["criteria"] if not c["passed"]] or "all criteria")
        ws = side(python, "episodes", url + "/openenv", "--episodes", "3", "--action",
                  json.dumps(ACTIONS["math"]))["episodes"]
        report("core03 ws", len(ws) == 3 and all(e["done"] for e in ws), "3 episodes")


def judge_keyless(python: str) -> None:
    with kit("math", free_port()) as url:
        base = url + "/openenv"
        try:
            side(python, "episodes", base, "--episodes", "1", "--action", "{}")
            report("keyless refused", False, "a keyless client played")
        except RuntimeError as exc:
            report("keyless refused", "401" in str(exc) or "HTTP 4" in str(exc),
                   str(exc).strip().splitlines()[-1][:120])
        # A client killed mid-episode: a child that resets, steps once and is SIGKILLed.
        code = (f"import asyncio,sys; sys.path.insert(0, {str(ROOT / 'bench')!r})\n"
                "from _openenv_side import _client\n"
                "async def go():\n"
                f"    env = _client({base!r}, {KEY!r}); await env.connect()\n"
                "    await env.reset(seed=1); print('reset', flush=True)\n"
                "    await asyncio.sleep(60)\n"
                "asyncio.run(go())\n")
        child = subprocess.Popen([python, "-c", code], stdout=subprocess.PIPE, text=True)
        child.stdout.readline()
        during = httpx.get(base + "/health", timeout=5).json()["capacity"]["active_sessions"]
        child.kill()
        child.wait(10)
        deadline = time.monotonic() + 10
        while (left := httpx.get(base + "/health", timeout=5).json()["capacity"][
                "active_sessions"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        report("vanished client", during == 1 and left == 0,
               f"sessions {during} while it played, {left} after it was killed")


def echo_app(python: str, tmp: Path) -> Path:
    subprocess.run([str(Path(python).parent / "openenv"), "init", "echo_env", "--output-dir",
                    str(tmp)], check=True, capture_output=True, timeout=120)
    folder = tmp / "echo_env"
    shutil.copy(ROOT / "bench" / "openenv_echo_app.py", folder / "task_app.py")
    return folder


def judge_echo(folder: Path) -> None:
    cli = str(Path(sys.executable).parent / "synth-deploy")
    env = {**os.environ, "ENVIRONMENT_API_KEY": KEY}
    smoke = subprocess.run([cli, "smoke", "task_app.py", "--seeds", "0-3", "--no-trace"],
                           capture_output=True, text=True, timeout=300, cwd=folder, env=env)
    report("echo smoke", smoke.returncode == 0,
           (smoke.stdout.strip().splitlines() or ["(no output)"])[-1][:160]
           if smoke.returncode == 0 else smoke.stderr[-400:])
    plan = subprocess.run([cli, "deploy", "task_app.py", "--dry-run"], capture_output=True,
                          text=True, timeout=300, cwd=folder, env=env)
    report("echo deploy --dry-run", plan.returncode == 0,
           "plan printed" if plan.returncode == 0 else (plan.stderr or plan.stdout)[-400:])


def latency(python: str, folder: Path, levels: list[int], steps: int) -> None:
    ours_port, theirs_port = free_port(), free_port()
    top = max(levels)
    theirs = Served([python, SIDE, "serve-echo", str(theirs_port), str(folder), "--sessions",
                     str(top)], theirs_port, "/health", cpu="0")
    ours = kit("task_app.py", ours_port, None, "--max-rollouts", str(top), cpu="0",
               cwd=str(folder))
    with theirs as theirs_url, ours as ours_url:
        for sessions in levels:
            row = {}
            for name, url, key in (("openenv", theirs_url, None),
                                   ("synth-deploy", ours_url + "/openenv", KEY)):
                args = ["latency", url, "--sessions", str(sessions), "--steps", str(steps)]
                row[name] = side(python, *args, *(["--key", key] if key else []))
            a, b = row["openenv"], row["synth-deploy"]
            ok = not b["failed"]
            report(f"latency {sessions} sessions", ok,
                   f"p50 {b['p50_ms']:.2f} ms vs OpenEnv {a['p50_ms']:.2f} ms "
                   f"({a['p50_ms'] / b['p50_ms']:.2f}x), p99 {b['p99_ms']:.2f} vs "
                   f"{a['p99_ms']:.2f} ms ({a['p99_ms'] / b['p99_ms']:.2f}x), steps/s "
                   f"{b['steps'] / b['wall_s']:.0f} vs {a['steps'] / a['wall_s']:.0f} "
                   f"({(b['steps'] / b['wall_s']) / (a['steps'] / a['wall_s']):.2f}x); "
                   f"failed sessions: ours {b['failed']}, OpenEnv's {a['failed']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--core03", help="python of a venv with openenv-core 0.3")
    parser.add_argument("--levels", default="1,64,256")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--apps", default="math,crafter")
    args = parser.parse_args()
    python = sys.executable
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for app in args.apps.split(","):
            judge_app(app, args.episodes, python, tmp)
        if args.core03:
            judge_core03(args.core03)
        judge_keyless(python)
        folder = echo_app(python, tmp)
        judge_echo(folder)
        latency(python, folder, [int(x) for x in args.levels.split(",")], args.steps)
    print(f"{len(failures)} failed" if failures else "all ok")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
