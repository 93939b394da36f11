"""A sandbox lives as long as its rollout, on a served app (`synth-deploy serve`, a child).

100 rollouts each hold a sandbox when the server is stopped: with SIGTERM (it drains) every
sandbox ends with it; with SIGKILL (nothing runs) the next server's sweeper ends them. Model
code that loops, forks, fills the disk or calls the network is contained while /health
answers, and its trace says which limit stopped it.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from processes import clean_env, free_port
from sandbox_processes import sandbox_processes, wait_for

APP = Path(__file__).with_name("sandboxed_app.py")


def body(run_id: str, command: str, **extra) -> dict:
    return {"run_id": run_id, "env": {"seed": 0, "config": {"command": command, **extra}},
            "policy": {"config": {"model": "none", "inference_url": "http://127.0.0.1:9/v1"}},
            "mode": "eval", **({"record": {"return_trace": True}})}


class Served:
    """`synth-deploy serve sandboxed_app.py` on a free port, its sandboxes under ``root``."""

    def __init__(self, tmp_path: Path, api_key: str, root: Path) -> None:
        self.port, self.key, self.root = free_port(), api_key, root
        shutil.copy(APP, tmp_path / APP.name)
        # Its log to a file: a pipe nobody reads fills with 100 cancelled rollouts'
        # tracebacks and stops the server mid-drain.
        self.log = open(tmp_path / f"serve-{self.port}.log", "w+")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "synth_deploy.cli", "serve", APP.name, "--port",
             str(self.port), "--no-trace", "--max-rollouts", "200"], cwd=tmp_path,
            env=clean_env(ENVIRONMENT_API_KEY=api_key, SANDBOX_TEST_ROOT=str(root)),
            stdout=subprocess.DEVNULL, stderr=self.log, text=True)
        self.url = f"http://127.0.0.1:{self.port}"
        wait_for(lambda: self._up(), timeout_s=60, what="the server up")

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            self.log.seek(0)
            raise AssertionError(f"server exited early: {self.log.read()[-2000:]}")
        try:
            return httpx.get(self.url + "/", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def fire(self, bodies: list[dict]) -> threading.Thread:
        """POST every body at once, in the background (their answers are not awaited)."""
        async def send():
            async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
                async def one(b):
                    try:
                        await client.post(self.url + "/rollout", json=b,
                                          headers={"X-API-Key": self.key})
                    except httpx.HTTPError:
                        pass
                await asyncio.gather(*(one(b) for b in bodies))
        thread = threading.Thread(target=asyncio.run, args=(send(),), daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self.log.close()


def folders(root: Path) -> list[Path]:
    return [p for p in (root / "sandboxed").glob("*") if p.is_dir()] \
        if (root / "sandboxed").is_dir() else []


HOLD = "sleep 240"
N = 100


@pytest.mark.slow
def test_sigterm_mid_run_ends_every_sandbox(tmp_path, api_key, sandbox_root):
    root = sandbox_root
    server = Served(tmp_path, api_key, root)
    try:
        server.fire([body(f"r{i}", HOLD) for i in range(N)])
        wait_for(lambda: len(sandbox_processes()) >= N and len(folders(root)) == N,
                 timeout_s=120, what=f"{N} sandboxes running")
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(timeout=120)
    finally:
        server.stop()
    assert sandbox_processes() == []
    assert folders(root) == []


@pytest.mark.slow
def test_sigkill_mid_run_leaves_them_to_the_next_servers_sweeper(tmp_path, api_key,
                                                                sandbox_root):
    root = sandbox_root
    server = Served(tmp_path, api_key, root)
    try:
        server.fire([body(f"r{i}", HOLD) for i in range(N)])
        wait_for(lambda: len(sandbox_processes()) >= N and len(folders(root)) == N,
                 timeout_s=120, what=f"{N} sandboxes running")
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(timeout=30)
        assert len(sandbox_processes()) >= N, "SIGKILL ran nothing: they are still there"
    finally:
        server.stop()
    restarted = Served(tmp_path, api_key, root)  # its start sweeps what the first one left
    try:
        wait_for(lambda: not sandbox_processes() and not folders(root), timeout_s=60,
                 what="the sweeper ending the sandboxes left behind")
    finally:
        restarted.proc.send_signal(signal.SIGTERM)
        restarted.stop()
    assert sandbox_processes() == []


HOSTILE = {
    "loop": ("while :; do :; done", 3, "timeout"),
    "fork_bomb": ("bash -c ':(){ :|:& };:'; sleep 30", 3, "timeout"),
    "disk": ("head -c 10G /dev/zero > big", 30, "file_size"),
    "network": ("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), "
                "timeout=5)\"", 30, None),
}


def test_hostile_code_is_contained_and_health_answers_throughout(tmp_path, api_key,
                                                                 sandbox_root):
    root = sandbox_root
    server = Served(tmp_path, api_key, root)
    answers: dict[str, dict] = {}
    health: list[float] = []
    try:
        async def rollouts():
            async with httpx.AsyncClient(timeout=60) as client:
                async def one(name, command, timeout_s):
                    resp = await client.post(server.url + "/rollout",
                                             json=body(name, command, timeout_s=timeout_s),
                                             headers={"X-API-Key": api_key})
                    answers[name] = resp.json()

                async def probe():
                    while len(answers) < len(HOSTILE):
                        started = time.perf_counter()
                        resp = await client.get(server.url + "/health",
                                                headers={"X-API-Key": api_key}, timeout=5)
                        assert resp.status_code == 200
                        health.append(time.perf_counter() - started)
                        await asyncio.sleep(0.1)

                await asyncio.gather(probe(), *(one(n, c, t) for n, (c, t, _) in
                                                HOSTILE.items()))
        asyncio.run(rollouts())
    finally:
        server.proc.send_signal(signal.SIGTERM)
        server.stop()
    assert len(health) >= 10 and max(health) < 2.0
    for name, (_, _, limit) in HOSTILE.items():
        answer = answers[name]
        assert answer["metrics"]["details"]["limit"] == limit, (name, answer["metrics"])
        event = command_event(answer)
        assert event["metadata"]["sandbox"]["limit"] == limit
        assert event["latency_ms"] > 0
    network = command_event(answers["network"])["metadata"]["sandbox"]
    assert network["exit_code"] == 1 and "Network is unreachable" in network["stderr"]
    fork = command_event(answers["fork_bomb"])["metadata"]["sandbox"]
    assert "Resource temporarily unavailable" in fork["stderr"]
    assert sandbox_processes() == [] and folders(root) == []


def command_event(answer: dict) -> dict:
    """The one command a rollout of this app ran, as its trace recorded it."""
    (event,) = [e for s in answer["trace"]["session_time_steps"] for e in s["events"]
                if e["event_type"] == "runtime" and "command" in e["metadata"]["sandbox"]]
    return event
