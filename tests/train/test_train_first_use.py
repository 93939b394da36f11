"""`train` and its SFT checks as a first-time user meets them (issue 14)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from synth_deploy.cli import app
from synth_deploy.train import validate_sft_file

RL_CONFIG = Path(__file__).parents[2] / "apps" / "math" / "configs" / "rl.toml"


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A clean working directory and a process environment without the kit's keys."""
    for name in ("SYNTH_API_KEY", "ENVIRONMENT_API_KEY", "TASK_APP_URL", "SYNTH_BACKEND_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def train(*args: str):
    return CliRunner().invoke(app, ["train", *args], env={"COLUMNS": "80"})


def jsonl(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_an_example_without_an_assistant_message_is_refused(tmp_path):
    path = jsonl(tmp_path / "d.jsonl",
                 json.dumps({"messages": [{"role": "user", "content": "2+2?"},
                                          {"role": "assistant", "content": "4"}]}),
                 json.dumps({"messages": [{"role": "system", "content": "Add."},
                                          {"role": "user", "content": "2+2?"}]}))
    result = validate_sft_file(path)
    assert result.count == 1 and result.error_count == 1
    [error] = result.errors
    assert error.line == 2 and error.message.startswith("messages: no assistant message")


@pytest.mark.parametrize("ending", ["\n", "\r\n"])
def test_a_line_cut_short_is_reported_at_its_own_column(tmp_path, ending):
    cut = '{"messages": [{"role": "user", "content": "hello"}'
    path = tmp_path / "d.jsonl"
    path.write_bytes((cut + ending).encode())
    [error] = validate_sft_file(path).errors
    assert error.line == 1
    assert error.message == f"invalid JSON: Expecting ',' delimiter (column {len(cut) + 1})"


def test_the_config_picker_leaves_test_suites_out(work):
    for folder in ("configs", "tests/fixtures", "test"):
        (work / folder).mkdir(parents=True)
        (work / folder / "rl.toml").write_text(RL_CONFIG.read_text())
    result = train()  # no --config and no terminal: the configs found are listed
    assert result.exit_code == 2
    assert f"found 1 config(s):\n  {work / 'configs' / 'rl.toml'}\n" in result.stderr


def test_a_dry_run_without_synth_api_key_says_it_will_be_needed(work):
    result = train("--config", str(RL_CONFIG), "--task-url", "https://app.example.com",
                   "--dry-run")
    assert result.exit_code == 0, result.output
    warning = " ".join(result.stderr.split())
    assert "Warning: SYNTH_API_KEY is not set: this dry run sends nothing, but submitting " \
           "the job will need it" in warning
    assert "Warning: ENVIRONMENT_API_KEY is not set" in warning
    assert "Bearer (not set)" in result.stdout


def test_a_loopback_task_url_warns_that_a_remote_backend_cannot_reach_it(work):
    result = train("--config", str(RL_CONFIG), "--task-url", "http://127.0.0.1:8001",
                   "--dry-run")
    assert result.exit_code == 0, result.output
    warning = " ".join(result.stderr.split())
    assert "the task URL http://127.0.0.1:8001 is on this machine: the training backend at " \
           "https://api.usesynth.ai cannot reach it; run `synth-deploy tunnel APP`" in warning
    # A backend on this machine can reach it: no warning then.
    local = train("--config", str(RL_CONFIG), "--task-url", "http://127.0.0.1:8001",
                  "--backend", "http://127.0.0.1:9", "--dry-run")
    assert local.exit_code == 0 and "is on this machine" not in local.stderr


def test_a_task_url_without_scheme_from_env_names_its_source(work):
    (work / ".env").write_text("TASK_APP_URL=my-app.modal.run\n")
    result = train("--config", str(RL_CONFIG), "--dry-run")
    assert result.exit_code == 2
    assert "Error: TASK_APP_URL: 'my-app.modal.run' has no scheme" in result.stderr
