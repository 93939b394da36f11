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
from standins.modal_sandbox import ModalSandboxStandin

APP = Path(__file__).with_name("sandboxed_app.py")


def body(run_id: str, command: str, **extra) -> dict:
    return {"run_id": run_id, "env": {"seed": 0, "config": {"command": command, **extra}},
            "policy": {"config": {"model": "none", "inference_url": "http://127.0.0.1:9/v1"}},
            "mode": "eval", **({"record": {"return_trace": True}})}


class Served:
    """`synth-deploy serve sandboxed_app.py` on a free port; its sandboxes local ones under
    ``root``, or Modal's stand-in ones (state in ``modal_state``)."""

    def __init__(self, tmp_path: Path, api_key: str, root: Path,
                 modal_state: Path | None = None, **env: str) -> None:
        self.port, self.key, self.root = free_port(), api_key, root
        backend = {} if modal_state is None else {
            "SANDBOX_TEST_MODAL_STATE": str(modal_state),
            "SANDBOX_TEST_TESTS": str(Path(__file__).resolve().parents[1])}
        shutil.copy(APP, tmp_path / APP.name)
        # Its log to a file: a pipe nobody reads fills with 100 cancelled rollouts'
        # tracebacks and stops the server mid-drain.
        self.log = open(tmp_path / f"serve-{self.port}.log", "w+")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "synth_deploy.cli", "serve", APP.name, "--port",
             str(self.port), "--no-trace", "--max-rollouts", "200"], cwd=tmp_path,
            env=clean_env(ENVIRONMENT_API_KEY=api_key, SANDBOX_TEST_ROOT=str(root),
                          **backend, **env),
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


class Held:
    """The sandboxes a served app holds, seen from outside: local ones by their folders and
    marked processes, Modal's (the stand-in's) by its records and their processes."""

    def __init__(self, backend: str, root: Path, tmp_path: Path) -> None:
        self.backend, self.root = backend, root
        self.state = tmp_path / "modal-state" if backend == "modal" else None
        self.standin = ModalSandboxStandin(self.state) if self.state else None
        self.seen: set[str] = set()

    def ids(self) -> list[str]:
        if self.standin is not None:
            found = [p.name for p in (self.state / "sandboxes").glob("sb-*")
                     if self.standin.Sandbox.from_id(p.name).running()]
        else:  # a folder is named <rollout>-<sandbox id>
            found = ["sb-" + p.name.rpartition("-sb-")[2] for p in folders(self.root)]
        self.seen.update(found)
        return found

    def processes(self) -> list[int]:
        """Live processes of every sandbox seen so far."""
        if self.standin is not None:
            return [pid for i in self.seen for pid in self.standin.processes(i)]
        return [pid for i in self.seen for pid in sandbox_processes(i)]


HOLD = "sleep 240"
SIZES = {"local": 100, "modal": 20}  # the stand-in's sandboxes are a Python process each


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", "modal"])
def test_sigterm_mid_run_ends_every_sandbox(tmp_path, api_key, sandbox_root, backend):
    n, held = SIZES[backend], Held(backend, sandbox_root, tmp_path)
    # The drain waits 2 s for rollouts that would run 240 s, then cancels them.
    server = Served(tmp_path, api_key, sandbox_root, held.state, SYNTH_DEPLOY_DRAIN_S="2")
    try:
        server.fire([body(f"r{i}", HOLD) for i in range(n)])
        wait_for(lambda: len(held.ids()) == n and len(held.processes()) >= n,
                 timeout_s=120, what=f"{n} sandboxes running")
        stopped_at = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(timeout=120)
        # Its bound, not the default 30 s (with time to end n sandboxes on a busy machine).
        assert time.monotonic() - stopped_at < 25
    finally:
        server.stop()
    assert len(held.seen) == n
    assert held.ids() == [] and held.processes() == []


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", "modal"])
def test_sigkill_mid_run_leaves_them_to_the_next_servers_sweeper(tmp_path, api_key,
                                                                sandbox_root, backend):
    n, held = SIZES[backend], Held(backend, sandbox_root, tmp_path)
    server = Served(tmp_path, api_key, sandbox_root, held.state)
    try:
        server.fire([body(f"r{i}", HOLD) for i in range(n)])
        wait_for(lambda: len(held.ids()) == n and len(held.processes()) >= n,
                 timeout_s=120, what=f"{n} sandboxes running")
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(timeout=30)
        assert len(held.ids()) == n, "SIGKILL ran nothing: they are still there"
    finally:
        server.stop()
    # The next server sweeps what the first left: at once locally (its owner is gone), once
    # their leases run out on Modal.
    restarted = Served(tmp_path, api_key, sandbox_root, held.state)
    try:
        wait_for(lambda: not held.ids() and not held.processes(), timeout_s=60,
                 what="the sweeper ending the sandboxes left behind")
    finally:
        restarted.proc.send_signal(signal.SIGTERM)
        restarted.stop()
    assert held.processes() == []


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
    # Every probe answered 200 within its 5 s; the loop never waited on the sandboxes.
    assert len(health) >= 10 and max(health) < 3.0
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
    ran = [command_event(a)["metadata"]["sandbox"]["id"] for a in answers.values()]
    assert [i for i in ran if sandbox_processes(i)] == [] and folders(root) == []


def command_event(answer: dict) -> dict:
    """The one command a rollout of this app ran, as its trace recorded it."""
    (event,) = [e for s in answer["trace"]["session_time_steps"] for e in s["events"]
                if e["event_type"] == "runtime" and "command" in e["metadata"]["sandbox"]]
    return event
