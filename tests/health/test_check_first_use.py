"""`check` as a first-time user meets it (issue 14): the URL from TASK_APP_URL, the real time a
--wait took, and hints kept whole at 80 columns."""

from __future__ import annotations

import json

import pytest
from standins.health_servers import closed_port
from typer.testing import CliRunner

from synth_deploy.cli import app


@pytest.fixture
def run(monkeypatch, tmp_path):
    """The CLI in-process from an empty directory, no kit variables in the environment."""
    monkeypatch.chdir(tmp_path)
    for name in ("ENVIRONMENT_API_KEY", "TASK_APP_URL"):
        monkeypatch.delenv(name, raising=False)

    def _run(*args: str, columns: int = 80):
        return CliRunner().invoke(app, ["check", *args], env={"COLUMNS": str(columns)})

    return _run


def test_without_a_url_check_reads_task_app_url(run, tmp_path, math_server, api_key):
    (tmp_path / ".env").write_text(f"ENVIRONMENT_API_KEY={api_key}\n"
                                   f"TASK_APP_URL={math_server.url}/\n")
    result = run("--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["url"] == math_server.url and report["healthy"]


def test_task_app_url_from_an_env_file_and_the_argument_wins(run, tmp_path, math_server,
                                                             api_key):
    env_file = tmp_path / "prod.env"
    env_file.write_text(f"ENVIRONMENT_API_KEY={api_key}\nTASK_APP_URL={math_server.url}\n")
    assert run("--env-file", str(env_file)).exit_code == 0
    dead = f"http://127.0.0.1:{closed_port()}"
    assert run(dead, "--env-file", str(env_file)).exit_code == 3


def test_no_url_and_no_task_app_url_is_a_usage_error_with_the_fix(run):
    result = run()
    assert result.exit_code == 2
    assert "Error: no URL to check: none given and TASK_APP_URL is not set" in result.stderr
    assert "synth-deploy tunnel" in result.stderr


def test_wait_reports_the_time_it_waited_not_the_last_attempt(run):
    dead = f"http://127.0.0.1:{closed_port()}"
    result = run(dead, "--wait", "1.5")
    assert result.exit_code == 3
    verdict = result.stdout.strip().splitlines()[-1]
    seconds, attempts = verdict.split("(")[1].split(",")[:2]
    assert float(seconds.removesuffix(" s")) >= 1.5
    assert int(attempts.split()[0]) >= 2
    report = json.loads(run(dead, "--wait", "1", "--json").stdout)
    assert report["duration_ms"] >= 1000 and report["attempts"] >= 2


def test_hints_are_never_cut_at_80_columns(run):
    port = closed_port()
    result = run(f"http://127.0.0.1:{port}")
    hint = next(line for line in result.stdout.splitlines() if line.startswith("✗ tcp: "))
    assert hint.endswith("or fix the port in the URL"), result.stdout
    assert f"--port {port}" in hint
