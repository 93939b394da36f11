"""`serve --reload`: the reloader's server processes follow the same key and trace rules as
`serve`, and pick up an edited app file. Real child processes, real uvicorn reloader."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time

import httpx
from processes import clean_env, free_port, run_cli, wait_until_up

APP = """
from synth_deploy.taskapp import TaskApp

task_app = TaskApp("reloady", name="Reloady", description="rewards a constant")

@task_app.rollout
def rollout(request, ctx):
    ctx.tracer.record_outcome_reward({reward})
"""


def start_reload(tmp_path, *args: str, **env: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    # Its own session: the reloader starts server processes, and the test ends them all.
    proc = subprocess.Popen(
        [sys.executable, "-m", "synth_deploy.cli", "serve", str(tmp_path / "reloady.py"),
         "--port", str(port), "--reload", *args], cwd=tmp_path, env=clean_env(**env),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


def stop_group(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    return proc.stderr.read()


def reward_of(url: str, key: str | None) -> float:
    headers = {"X-API-Key": key} if key else {}
    resp = httpx.post(url + "/rollout", headers=headers, timeout=10,
                      json={"run_id": "r", "env": {"seed": 1}})
    assert resp.status_code == 200, resp.text
    return resp.json()["metrics"]["reward_mean"]


def test_reload_keeps_the_key_and_traces_and_follows_edits(tmp_path, api_key):
    (tmp_path / "reloady.py").write_text(APP.format(reward=0.25))
    (tmp_path / "keys.env").write_text(f"ENVIRONMENT_API_KEY={api_key}\n")
    db = tmp_path / "reload.db"
    proc, url = start_reload(tmp_path, "--env-file", "keys.env", "--trace-db", str(db))
    try:
        wait_until_up(url, proc, timeout_s=30)
        assert httpx.get(url + "/health").status_code == 401  # the reloaded server has the key
        assert httpx.get(url + "/health", headers={"X-API-Key": api_key}).status_code == 200
        assert reward_of(url, api_key) == 0.25

        (tmp_path / "reloady.py").write_text(APP.format(reward=0.75))
        deadline = time.monotonic() + 30
        seen = None
        while time.monotonic() < deadline:
            try:
                seen = reward_of(url, api_key)
            except (httpx.HTTPError, AssertionError):
                seen = None  # between the old server's exit and the new one's start
            if seen == 0.75:
                break
            time.sleep(0.2)
        assert seen == 0.75, "the edited app file was not served"
    finally:
        stderr = stop_group(proc)
    assert api_key not in stderr
    with sqlite3.connect(db) as conn:
        rewards = sorted(r for (r,) in conn.execute(
            "SELECT total_reward FROM outcome_rewards"))
    assert rewards[0] == 0.25 and rewards[-1] == 0.75  # both processes wrote to --trace-db


def test_reload_without_a_key_refuses_before_starting_the_reloader(tmp_path):
    (tmp_path / "reloady.py").write_text(APP.format(reward=1.0))
    result = run_cli(tmp_path, "serve", str(tmp_path / "reloady.py"), "--reload",
                     "--port", str(free_port()), timeout=30)
    assert result.returncode == 2 and "no ENVIRONMENT_API_KEY" in result.stderr
    assert "Traceback" not in result.stderr


def test_reload_with_no_auth_serves_without_a_key(tmp_path):
    (tmp_path / "reloady.py").write_text(APP.format(reward=1.0))
    proc, url = start_reload(tmp_path, "--no-auth", "--no-trace")
    try:
        wait_until_up(url, proc, timeout_s=30)
        assert reward_of(url, None) == 1.0
    finally:
        stop_group(proc)
