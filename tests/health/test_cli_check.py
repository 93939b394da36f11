"""`synth-deploy check`: rendering, --json, key resolution, --wait and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from standins.health_servers import closed_port, cold_start
from typer.testing import CliRunner

from synth_deploy.cli import app
from synth_deploy.env import fingerprint
from synth_deploy.health import STEPS
from synth_deploy.serving import create_app


@pytest.fixture
def run(monkeypatch, tmp_path):
    """Invoke the CLI in-process from an empty directory with no key in the environment."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ENVIRONMENT_API_KEY", raising=False)

    def _run(*args: str):
        return CliRunner().invoke(app, ["check", *args])

    return _run


def test_healthy_app_prints_a_table_and_exits_0(run, math_server, api_key):
    result = run(math_server.url, "--api-key", api_key, "--seeds", "0-2")
    assert result.exit_code == 0, result.output
    for name in STEPS:
        assert name in result.stdout
    assert "3 valid TaskInfo" in result.stdout
    assert f"key: --api-key, sha256:{fingerprint(api_key)}" in result.stdout
    assert "healthy" in result.stdout and api_key not in result.output


def test_json_output_has_the_documented_shape(run, math_server, api_key):
    result = run(math_server.url, "--api-key", api_key, "--json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert set(data) == {"url", "healthy", "exit_code", "key", "duration_ms", "attempts",
                         "failure", "checks", "traces", "identity"}
    assert set(data["identity"]) == {"version", "digest", "label"}
    assert data["healthy"] is True and data["exit_code"] == 0 and data["failure"] is None
    assert [c["name"] for c in data["checks"]] == list(STEPS)
    assert set(data["checks"][0]) == {"name", "verdict", "code", "expected", "actual",
                                      "latency_ms", "hint"}


def test_key_from_env_file_mismatch_exits_1_and_shows_only_a_fingerprint(run, math_server,
                                                                         tmp_path):
    wrong = "sk_env_from_file_0123456789abcdef"
    env_file = tmp_path / "server.env"
    env_file.write_text(f"ENVIRONMENT_API_KEY={wrong}\n")
    result = run(math_server.url, "--env-file", str(env_file), "--json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["failure"]["code"] == "key_mismatch"
    assert data["key"] == {"source": f"ENVIRONMENT_API_KEY from {env_file}",
                           "fingerprint": f"sha256:{fingerprint(wrong)}"}
    assert wrong not in result.output


def test_key_from_dotenv_in_working_directory(run, math_server, api_key, tmp_path):
    (tmp_path / ".env").write_text(f"ENVIRONMENT_API_KEY={api_key}\n")
    result = run(math_server.url)
    assert result.exit_code == 0, result.output
    assert "ENVIRONMENT_API_KEY from .env" in result.stdout


@pytest.mark.parametrize("extra", [(), ("--json",), ("--wait", "0.5")],
                         ids=["table", "json", "wait"])
def test_a_password_in_the_url_is_never_printed(run, math_server, api_key, extra):
    url = math_server.url.replace("http://", "http://user:hunter2-pass@")
    result = run(url + "/?token=hunter3-token", "--api-key", api_key, *extra)
    assert "hunter2-pass" not in result.output and "hunter3-token" not in result.output
    assert "http://****@127.0.0.1" in result.output


def test_unreachable_exits_3(run):
    result = run(f"http://127.0.0.1:{closed_port()}", "--api-key", "k" * 16)
    assert result.exit_code == 3
    assert "connection refused" in result.stdout and "nothing listens" in result.stdout


def test_endpoint_in_url_exits_2_with_the_fix(run):
    result = run("http://127.0.0.1:8001/health")
    assert result.exit_code == 2
    assert "http://127.0.0.1:8001" in result.stdout and "without the endpoint" in result.stdout


@pytest.mark.parametrize("args", [
    ["--api-key", "k", "--env-file", "x.env"],
    ["--seeds", "9-1"],
    ["--timeout", "0"],
])
def test_usage_errors_exit_2(run, args):
    result = run("http://127.0.0.1:8001", *args)
    assert result.exit_code == 2, result.output


def test_rollout_without_an_inference_url_plays_through_the_mock_policy(run, math_server,
                                                                         api_key):
    # As `check --load` does: the mock policy, served for the check, plays the rollout.
    result = run(math_server.url, "--api-key", api_key, "--rollout", "--seeds", "3", "--json")
    assert result.exit_code == 0, result.output
    [rollout] = [c for c in json.loads(result.stdout)["checks"] if c["name"] == "rollout"]
    assert rollout["verdict"] == "pass" and rollout["actual"].startswith("reward_mean=")
    human = run(math_server.url, "--api-key", api_key, "--rollout")
    assert human.exit_code == 0, human.output
    assert "rollout policy: built-in mock at http://127.0.0.1:" in human.stderr
    assert "another machine" not in human.stderr


def test_wait_polls_with_a_progress_line_until_healthy(run, serve, math_config, api_key):
    server = serve(cold_start(create_app(math_config, api_keys=[api_key]), 0.5))
    result = run(server.url, "--api-key", api_key, "--wait", "15", "--json")
    assert result.exit_code == 0, result.output
    assert "attempt 1" in result.stderr and "attempt 2" in result.stderr
    assert "unhealthy: root" in result.stderr
    assert json.loads(result.stdout)["healthy"] is True


def test_wait_runs_out_of_time(run):
    result = run(f"http://127.0.0.1:{closed_port()}", "--wait", "0.5")
    assert result.exit_code == 3
    assert "attempt 1" in result.stderr


def test_real_process_end_to_end(math_server, api_key, tmp_path):
    env = {**os.environ, "ENVIRONMENT_API_KEY": api_key}
    proc = subprocess.run([sys.executable, "-m", "synth_deploy.cli", "check", math_server.url,
                           "--json"], capture_output=True, text=True, timeout=60, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["key"]["source"] == "ENVIRONMENT_API_KEY from the environment"
    assert api_key not in proc.stdout + proc.stderr


def test_cli_module_imports_nothing_heavy():
    code = ("import sys, synth_deploy.cli.check\n"
            "print([m for m in ('fastapi', 'uvicorn', 'modal', 'libsql', 'httpx', 'pydantic',"
            " 'rich') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.strip()
    assert out == "[]"


def test_a_rollout_that_records_no_reward_is_a_warning(run, serve, api_key):
    from synth_deploy.taskapp import TaskApp

    task_app = TaskApp("unrewarded", name="Unrewarded", description="Records nothing.")
    task_app.rollout(lambda request, ctx: {})
    server = serve(create_app(task_app.build_config(), api_keys=[api_key]))
    result = run(server.url, "--api-key", api_key, "--rollout", "--json")
    [rollout] = [c for c in json.loads(result.stdout)["checks"] if c["name"] == "rollout"]
    assert rollout["verdict"] == "warn" and rollout["code"] == "no_reward", rollout
    assert "no reward recorded" in rollout["actual"]
    assert "record_outcome_reward" in rollout["hint"]
