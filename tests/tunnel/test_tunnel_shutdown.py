"""Nothing outlives its parent: cloudflared (the stand-in) and the local server stop when the
process that opened the tunnel is interrupted, terminated, killed, or simply exits."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from standins.cloudflared_helpers import STANDIN, StandinState, wait_gone

TESTS = Path(__file__).parents[1]  # where standins/ lives

PARENT = """
import sys, time
sys.path.insert(0, {tests!r})
from standins.cloudflared_helpers import COMMAND
from synth_deploy.tunnel import Tunnel, TunnelConfig
config = TunnelConfig("http://127.0.0.1:9", verify=False, orphan_guard=sys.argv[1])
tunnel = Tunnel(config, command=COMMAND).start()
print("READY", tunnel.process.pid, flush=True)
if sys.argv[2] == "exit":
    sys.exit(0)  # without stopping the tunnel: atexit must
time.sleep(60)
"""


class Child:
    """A child process whose stdout lines are read on a thread, so waits have timeouts."""

    def __init__(self, argv, **kwargs) -> None:
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, **kwargs)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    # A bound for a process that hangs, not a wait: under the whole suite's load a CLI that
    # serves an app and starts cloudflared (or restarts it) has taken over 20 s.
    def line(self, timeout_s: float = 45.0) -> str:
        try:
            return self.lines.get(timeout=timeout_s)
        except queue.Empty:
            self.proc.kill()
            raise AssertionError(f"no output within {timeout_s}s; stderr: "
                                 f"{self.proc.stderr.read()[-2000:]}") from None

    def finish(self, timeout_s: float = 30.0) -> tuple[int, str]:
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        return code, self.proc.stderr.read()


@pytest.fixture
def spawn():
    """spawn(argv, **popen_kwargs) -> Child; any still running at teardown is killed."""
    children: list[Child] = []

    def _spawn(argv, **kwargs) -> Child:
        children.append(Child(argv, **kwargs))
        return children[-1]

    yield _spawn
    for child in children:
        if child.proc.poll() is None:
            child.proc.kill()
            child.proc.wait(5)


def child_env(standin: StandinState, mode: str = "ok", **extra: str) -> dict[str, str]:
    return {**os.environ, **standin.env(mode), "COLUMNS": "400", **extra}


@pytest.mark.parametrize("how, guard", [
    ("SIGTERM", "auto"),
    ("SIGKILL", "auto"),
    ("SIGKILL", "watchdog"),
    ("exit", "none"),
])
def test_cloudflared_dies_with_the_library_parent(tmp_path, spawn, how, guard):
    standin = StandinState(tmp_path / "standin")
    parent = spawn([sys.executable, "-c", PARENT.format(tests=str(TESTS)), guard,
                    "exit" if how == "exit" else "stay"], env=child_env(standin))
    word, pid = parent.line().split()
    assert word == "READY" and int(pid) in standin.pids()
    if how != "exit":
        os.kill(parent.proc.pid, getattr(signal, how))
    parent.finish()
    assert wait_gone([int(pid)]) == []
    assert standin.pids() == [int(pid)]  # and no "restart" was spawned while exiting


CLI = [sys.executable, "-c", "from synth_deploy.cli import main; main()", "tunnel"]


@pytest.fixture
def project(tmp_path, api_key) -> Path:
    (tmp_path / ".env").write_text(f"# mine\nENVIRONMENT_API_KEY={api_key}\nOTHER=kept\n")
    return tmp_path


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])  # SIGINT: the human-mode test
def test_cli_stops_cloudflared_and_the_server(project, spawn, api_key, how):
    standin = StandinState(project / "standin")
    cli = spawn([*CLI, "math", "--no-verify", "--json"], cwd=project,
                env=child_env(standin, CLOUDFLARED_PATH=str(STANDIN)))
    ready = json.loads(cli.line())
    assert ready["event"] == "ready" and ready["app"] == "math"
    assert (project / ".env").read_text() == (f"# mine\nENVIRONMENT_API_KEY={api_key}\n"
                                              f"OTHER=kept\nTASK_APP_URL={ready['url']}\n")
    # A real request through cloudflared's forwarder reaches the served app.
    public = standin.resolve(ready["url"])
    assert httpx.get(public + "/health", headers={"X-API-Key": api_key},
                     timeout=5).json()["service"] == "math"

    os.kill(cli.proc.pid, getattr(signal, how))
    code, stderr = cli.finish()
    assert code == (-signal.SIGKILL if how == "SIGKILL" else 130), stderr
    assert wait_gone(standin.pids()) == []
    for url in (ready["local_url"], public):
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/", timeout=2)


@pytest.mark.slow
def test_cli_reports_the_new_url_after_a_restart(project, spawn, api_key):
    standin = StandinState(project / "standin")
    cli = spawn([*CLI, "math", "--no-verify", "--json"], cwd=project,
                env=child_env(standin, "dies,ok", CLOUDFLARED_PATH=str(STANDIN)))
    first = json.loads(cli.line())["url"]
    standin.crash(1)
    events = [json.loads(cli.line()) for _ in range(3)]
    assert [e["event"] for e in events] == ["died", "restarting", "restarted"]
    new = events[-1]["url"]
    assert new != first and f"TASK_APP_URL={new}\n" in (project / ".env").read_text()
    assert httpx.get(standin.resolve(new) + "/health", headers={"X-API-Key": api_key},
                     timeout=5).status_code == 200
    os.kill(cli.proc.pid, signal.SIGTERM)
    assert cli.finish()[0] == 130
    assert wait_gone(standin.pids()) == []


def test_cli_exposes_a_running_server_in_human_mode(project, spawn, math_server, api_key):
    standin = StandinState(project / "standin")
    cli = spawn([*CLI, "--url", math_server.url, "--no-verify", "--write-env", ""],
                cwd=project, env=child_env(standin, CLOUDFLARED_PATH=str(STANDIN)))
    line = cli.line()
    assert line.startswith("public URL: https://") and "trycloudflare.com" in line
    url = line.split()[2]
    assert httpx.get(standin.resolve(url) + "/info", headers={"X-API-Key": api_key},
                     timeout=5).status_code == 200
    assert "TASK_APP_URL" not in (project / ".env").read_text()
    os.kill(cli.proc.pid, signal.SIGINT)
    code, stderr = cli.finish()
    assert code == 130
    assert "quick tunnels allow about 200" in stderr and "interrupted" in stderr
    assert math_server.url in stderr  # "local server http://127.0.0.1:P"
    assert wait_gone(standin.pids()) == []


def test_cli_without_cloudflared_fails_fast_with_the_install_command(tmp_path, api_key):
    from synth_deploy.tunnel import install_hint

    (tmp_path / ".env").write_text(f"ENVIRONMENT_API_KEY={api_key}\n")
    env = {k: v for k, v in os.environ.items() if k != "CLOUDFLARED_PATH"}
    env.update(PATH=str(Path(sys.executable).parent), COLUMNS="400")
    started = time.monotonic()
    done = subprocess.run([*CLI, "math"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=30)
    assert time.monotonic() - started < 10
    assert done.returncode == 1
    assert "cloudflared was not found on PATH" in done.stderr
    assert install_hint() in done.stderr.replace("\n", "")


@pytest.mark.parametrize("args, says", [
    ([], "name a task app to serve"),
    (["math", "--url", "http://127.0.0.1:8001"], "name a task app to serve"),
    (["math", "--mode", "named", "--hostname", "a.example.com"], "needs its token"),
    (["math", "--mode", "named", "--token", "t0k3n-value"], "public hostname"),
    (["math", "--mode", "sideways"], "is not quick or named"),
])
def test_cli_usage_errors_exit_2(project, monkeypatch, args, says):
    from typer.testing import CliRunner

    from synth_deploy.cli import app

    monkeypatch.chdir(project)
    monkeypatch.delenv("TUNNEL_TOKEN", raising=False)
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    result = CliRunner().invoke(app, ["tunnel", *args], env={
        "CLOUDFLARED_PATH": str(STANDIN), "COLUMNS": "400"})
    assert result.exit_code == 2 and says in result.output, result.output
    assert "t0k3n-value" not in result.output
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)) == handlers


def test_cli_startup_failure_shows_cloudflareds_lines(project):
    standin = StandinState(project / "standin")
    done = subprocess.run([*CLI, "math"], cwd=project, capture_output=True, text=True,
                          timeout=30, env=child_env(standin, "rate-limit",
                                                    CLOUDFLARED_PATH=str(STANDIN)))
    assert done.returncode == 1
    assert "rate-limiting quick-tunnel creation" in done.stderr
    assert "cloudflared's last lines" in done.stderr and "429 Too Many Requests" in done.stderr
    assert "TASK_APP_URL" not in (project / ".env").read_text()


@pytest.mark.slow
def test_cli_records_rollouts_through_the_tunnel(project, spawn, api_key, mock_policy):
    standin = StandinState(project / "standin")
    db = project / "tunnel-traces.db"
    cli = spawn([*CLI, "math", "--no-verify", "--json", "--trace-db", str(db)], cwd=project,
                env=child_env(standin, CLOUDFLARED_PATH=str(STANDIN)))
    public = standin.resolve(json.loads(cli.line())["url"])
    resp = httpx.post(public + "/rollout", headers={"X-API-Key": api_key}, timeout=20, json={
        "run_id": "via-tunnel", "env": {"seed": 4},
        "policy": {"config": {"model": "m", "inference_url": mock_policy.url + "/v1"}}})
    assert resp.status_code == 200, resp.text
    os.kill(cli.proc.pid, signal.SIGTERM)
    assert cli.finish()[0] == 130
    assert wait_gone(standin.pids()) == []
    import sqlite3

    with sqlite3.connect(db) as conn:
        rows = [json.loads(r[0]) for r in conn.execute("SELECT metadata FROM session_traces")]
    assert [(r["run_id"], r["seed"]) for r in rows] == [("via-tunnel", 4)]
