"""`serve`, `setup`, `apps` and start-up cost, run as real child processes."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import httpx
import pytest
from processes import clean_env, free_port, run_cli, wait_until_up

SLOW_APP = textwrap.dedent('''
    import asyncio
    from synth_deploy.taskapp import TaskDescriptor, TaskInfo
    from synth_deploy.taskapp.config import TaskAppConfig
    from synth_deploy.taskapp.registry import register_task_app

    async def rollout(request, ctx):
        await asyncio.sleep(float(request.env.config.get("sleep", 0)))
        return {"run_id": request.run_id, "metrics": {"episode_rewards": [1.0]}}

    def build():
        return TaskAppConfig(app_id="slowpoke", name="Slow", description="sleeps",
                             base_task_info=TaskInfo(task=TaskDescriptor(id="slowpoke", name="S")),
                             provide_task_instances=lambda seeds: [], rollout=rollout)

    register_task_app(app_id="slowpoke", config_factory=build)
''')


def start_serve(tmp_path, app_ref, port, *flags, **env):
    return subprocess.Popen(
        [sys.executable, "-m", "synth_deploy.cli", "serve", app_ref, "--port", str(port),
         "--no-trace", *flags], cwd=tmp_path, env=clean_env(**env),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stop(proc) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(5)


@pytest.mark.slow
def test_sigterm_drains_in_flight_rollouts_then_exits(tmp_path, api_key):
    app_file = tmp_path / "slow_app.py"
    app_file.write_text(SLOW_APP)
    port = free_port()
    proc = start_serve(tmp_path, str(app_file), port, ENVIRONMENT_API_KEY=api_key)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, proc)
        result = {}

        def slow_rollout():
            result["resp"] = httpx.post(url + "/rollout", headers={"X-API-Key": api_key},
                                        json={"run_id": "drain", "env": {"config": {"sleep": 1.5}}},
                                        timeout=20)

        worker = threading.Thread(target=slow_rollout)
        worker.start()
        wait_for_in_flight(url, api_key, 1)
        term_at = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        worker.join(20)
        assert result["resp"].status_code == 200 and result["resp"].json()["run_id"] == "drain"
        # uvicorn re-raises the signal once drained: dying "by SIGTERM" is the clean exit.
        assert proc.wait(10) in (0, -signal.SIGTERM)
        assert time.monotonic() - term_at < 5, "shutdown waited far past the drain"
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/", timeout=1)
        stderr = proc.stderr.read()
    finally:
        stop(proc)
    # What the drain waits for, while it waits; then the last window's rollout, summed up.
    waiting = next(x for x in stderr.splitlines() if "draining: waiting for" in x)
    assert "1 rollout in flight" in waiting and "Ctrl+C stops now" in waiting, stderr
    after = stderr.split(waiting, 1)[1]
    assert re.search(r"1 rollout in [\d.]+s \([\d.]+/s\) · p50 1\.\d+s", after), stderr


def wait_for_in_flight(url: str, api_key: str, count: int, within_s: float = 10) -> None:
    """Until the server's /health counts ``count`` rollouts in flight."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        health = httpx.get(url + "/health", headers={"X-API-Key": api_key}, timeout=5).json()
        if health["rollouts"]["in_flight"] >= count:
            return
        time.sleep(0.02)
    raise AssertionError(f"{count} rollouts never were in flight at {url}")


def test_serve_without_a_key_refuses_to_start_and_says_how_to_fix_it(tmp_path):
    result = run_cli(tmp_path, "serve", "math", "--port", str(free_port()), "--no-trace",
                     timeout=30)
    assert result.returncode == 2
    assert "no ENVIRONMENT_API_KEY" in result.stderr and "synth-deploy setup" in result.stderr
    assert "--no-auth" in result.stderr and "Traceback" not in result.stderr


def test_serve_no_auth_answers_without_a_key_and_warns(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "synth_deploy.cli", "serve", "math", "--port", str(port),
         "--no-trace", "--no-auth"], cwd=tmp_path, env=clean_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, proc)
        health = httpx.get(url + "/health")
        assert health.status_code == 200
        assert health.json()["auth"] == {"required": False, "enabled": False}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
        stderr = proc.stderr.read()
    assert stderr.count("never expose") == 1, stderr
    assert f"OpenEnv clients: base URL {url}/openenv" in stderr  # math declares an environment


def test_the_access_log_names_the_client_a_local_proxy_forwarded(tmp_path, api_key):
    # cloudflared connects from 127.0.0.1 and says who the client is in X-Forwarded-For.
    port = free_port()
    proc = start_serve(tmp_path, "math", port, "--access-log", ENVIRONMENT_API_KEY=api_key)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, proc)
        health = httpx.get(url + "/health", headers={"X-API-Key": api_key,
                                                     "X-Forwarded-For": "203.0.113.7"})
        assert health.status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    assert '203.0.113.7:0 - "GET /health HTTP/1.1" 200' in out + err, out + err


def test_a_key_in_an_openenv_base_url_is_never_in_the_access_log(tmp_path, api_key):
    port = free_port()
    proc = start_serve(tmp_path, "math", port, "--access-log", ENVIRONMENT_API_KEY=api_key)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, proc)
        resp = httpx.post(f"{url}/openenv/key/{api_key}/reset", json={"seed": 1}, timeout=5)
        assert resp.status_code == 200, resp.text
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    assert '"POST /openenv/reset HTTP/1.1" 200' in out + err, out + err
    assert api_key not in out + err


def test_serve_on_a_busy_port_fails_fast_with_the_fix(tmp_path, api_key):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = start_serve(tmp_path, "math", port, ENVIRONMENT_API_KEY=api_key)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 2
    assert f"127.0.0.1:{port}" in err and "--port" in err
    assert "serving math" not in err  # the banner follows a successful bind only


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_serve_on_a_port_out_of_range_is_a_usage_error_without_a_traceback(tmp_path, port):
    proc = subprocess.run([sys.executable, "-m", "synth_deploy.cli", "serve", "math",
                           "--port", port], cwd=tmp_path, capture_output=True, text=True,
                          env=clean_env(ENVIRONMENT_API_KEY="k" * 20), timeout=20)
    assert proc.returncode == 2
    assert "Invalid value for '--port'" in proc.stderr
    assert "Traceback" not in proc.stderr and "serving math" not in proc.stderr


def test_serve_unknown_app_suggests_the_close_match(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "synth_deploy.cli", "serve", "maths"],
                          cwd=tmp_path, env=clean_env(ENVIRONMENT_API_KEY="k" * 20),
                          capture_output=True, text=True, timeout=20)
    assert proc.returncode == 2
    assert "no task app with id 'maths'" in proc.stderr and "did you mean 'math'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_setup_mints_a_key_keeping_every_other_line(tmp_path):
    original = "# keep me\nOPENAI_API_KEY=sk-1\n\nexport OTHER='x y'\n"
    (tmp_path / ".env").write_text(original)
    first = run_cli(tmp_path, "setup")
    assert first.returncode == 0, first.stderr
    text = (tmp_path / ".env").read_text()
    assert text.startswith(original)
    key = text.splitlines()[-1].split("=", 1)[1]
    assert key.startswith("sk_env_") and key not in first.stdout + first.stderr
    assert "sha256:" in first.stdout
    again = run_cli(tmp_path, "setup", "--json")
    assert json.loads(again.stdout)["action"] == "kept"
    assert (tmp_path / ".env").read_text() == text
    forced = run_cli(tmp_path, "setup", "--force")
    assert forced.returncode == 0
    new_text = (tmp_path / ".env").read_text()
    assert key not in new_text and new_text.startswith(original)


def test_setup_creates_a_missing_env_file(tmp_path):
    result = run_cli(tmp_path, "setup")
    assert result.returncode == 0
    assert (tmp_path / ".env").read_text().startswith("ENVIRONMENT_API_KEY=sk_env_")


def test_setup_refuses_a_broken_env_file_and_leaves_it_alone(tmp_path):
    broken = "GOOD=1\nnot valid at all\n"
    (tmp_path / ".env").write_text(broken)
    result = run_cli(tmp_path, "setup")
    assert result.returncode == 2 and ".env:2" in result.stderr
    assert (tmp_path / ".env").read_text() == broken


def test_apps_lists_math_as_json(tmp_path):
    result = run_cli(tmp_path, "apps", "--json")
    apps = {a["app_id"]: a for a in json.loads(result.stdout)["apps"]}
    assert apps["math"]["path"].endswith("apps/math/task_app.py")


def test_help_imports_no_heavy_modules():
    code = ("import sys\nfrom synth_deploy.cli import app\n"
            "try:\n    app(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('modal', 'fastapi', 'uvicorn', 'libsql', 'starlette') "
            "if m in sys.modules]\nprint('HEAVY', heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=30).stdout
    assert "HEAVY []" in out, out


def test_an_app_without_routers_is_served_without_fastapi():
    # FastAPI is a fifth of a second of every cold start; only an app's own routers need it.
    code = ("import sys, httpx\n"
            "from synth_deploy.env import Env\n"
            "from synth_deploy.serving import LocalRunner, ServeSettings, server_keys\n"
            "settings = ServeSettings(app='math', env=Env(), keys=server_keys(Env(), 'open'))\n"
            "with LocalRunner(settings) as running:\n"
            "    status = httpx.get(running.url + '/health', timeout=5).status_code\n"
            "print('STATUS', status, 'FASTAPI', 'fastapi' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert "STATUS 200 FASTAPI False" in out.stdout, out.stdout + out.stderr


def test_init_writes_an_app_that_smokes_and_an_rl_toml_that_loads(tmp_path):
    from synth_deploy.train import load_config

    result = run_cli(tmp_path, "init", "guess", timeout=60)
    assert result.returncode == 0, result.stderr
    assert "next: synth-deploy smoke guess" in result.stdout
    rl = (tmp_path / "guess" / "rl.toml").read_text()
    # Every field worth a question says what it is, on its own line.
    for field in ("task_url", "gpus_for_vllm", "max_concurrent_rollouts", "group_size",
                  "trainer_mode", "weight_sync_interval"):
        line = next(x for x in rl.splitlines() if x.startswith(field))
        assert "#" in line, line
    # One comment column, whatever the name's length did to the lines.
    assert len({x.find("#") for x in rl.splitlines() if x.find("#") > 0}) == 1, rl
    readme = (tmp_path / "guess" / "README.md").read_text()
    assert "synth-deploy smoke guess\n" in readme and "--app guess\n" in readme
    assert load_config(tmp_path / "guess" / "rl.toml") is not None
    listed = json.loads(run_cli(tmp_path, "apps", "--json").stdout)["apps"]
    guess = [a["path"] for a in listed if a["app_id"] == "guess"]
    assert guess == [str(tmp_path / "guess" / "task_app.py")], listed
    smoked = run_cli(tmp_path, "smoke", "guess", "--json", "--no-trace", timeout=120)
    assert smoked.returncode == 0, smoked.stderr
    report = json.loads(smoked.stdout)
    assert report["summary"]["errors"] == 0 and report["summary"]["rollouts"] == 10
    again = run_cli(tmp_path, "init", "guess", timeout=60)
    assert again.returncode == 2 and "exists already: nothing was written" in again.stderr
    bad = run_cli(tmp_path, "init", "Not A Name", timeout=60)
    assert bad.returncode == 2 and "is not a task app name" in bad.stderr
