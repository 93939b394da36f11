"""The crafter app under the kit's commands, as real child processes: smoke through the mock
policy (traces stored, replayed and exported as tool-calling SFT data), eval, serve + check
--rollout, deploy --dry-run, and plain `modal deploy` against the stand-in Modal CLI."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from processes import clean_env, free_port, run_cli, wait_until_up
from standins.modal_api import ModalAPIStandin
from standins.modal_helpers import stop_containers
from typer.testing import CliRunner

from synth_deploy.cli import app as cli_app
from synth_deploy.train import validate_sft_file

ROOT = Path(__file__).resolve().parents[2]
CRAFTER_FILE = ROOT / "apps" / "crafter" / "task_app.py"
STANDIN_MODAL = ROOT / "tests" / "standins" / "modal_cli.py"
DEV_ONLY = ("pytest", "ruff", "modal", "typer", "rich", "uvicorn", "cryptography", "libsql",
            "python-dotenv")


@pytest.mark.slow
def test_smoke_plays_through_the_mock_policy_and_traces_replay_and_export(tmp_path):
    smoke = run_cli(tmp_path, "smoke", "crafter", "--seeds", "0,3", "--json", timeout=300)
    assert smoke.returncode == 0, smoke.stderr
    report = json.loads(smoke.stdout)
    assert report["summary"]["errors"] == 0 and report["summary"]["mean_reward"] > 0
    for rollout in report["rollouts"]:
        details = rollout["details"]
        assert details["turns"] == 40 and details["difficulty"] == "easy"
        assert rollout["reward"] == details["achievements"] == len(details["unlocked"])
    listed = json.loads(run_cli(tmp_path, "traces", "ls", "--json").stdout)
    assert sorted(s["seed"] for s in listed) == [0, 3]
    assert {s["app_id"] for s in listed} == {"crafter"}

    best = max(listed, key=lambda s: s["total_reward"])
    show = run_cli(tmp_path, "traces", "show", best["session_id"])
    assert show.returncode == 0, show.stderr
    out = show.stdout
    assert "· turn-40 (turn 40)" in out and "earlier messages not repeated" in out
    assert '→ interact({"actions": [' in out and "environment reward=" in out
    assert "event reward unique_achievement_delta=1" in out
    assert "data:image" not in out

    export = run_cli(tmp_path, "traces", "export", "--format", "sft", "--out", "sft.jsonl")
    assert export.returncode == 0, export.stderr
    checked = validate_sft_file(tmp_path / "sft.jsonl")
    assert checked.ok and checked.count == 80, checked.errors  # one example a policy turn
    examples = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    late = next(e for e in examples if e["metadata"]["turn"] == 10)
    roles = [m["role"] for m in late["messages"]]
    assert roles[:2] == ["system", "user"] and roles[-1] == "assistant"
    assert roles.count("tool") >= 3  # earlier turns: call, tool result, next observation
    assert late["messages"][-1]["tool_calls"][0]["function"]["name"] == "interact"
    for m in late["messages"]:
        if m["role"] == "tool":
            assert m["tool_call_id"]
    assert late["tools"][0]["name"] == "interact"  # flat, as synth-ai's SFT reader takes it


@pytest.mark.slow
def test_eval_prints_the_rubric_scores(tmp_path):
    result = run_cli(tmp_path, "eval", "crafter", "--seeds", "6", "--no-trace", "--json",
                     timeout=300)
    assert result.returncode == 0, result.stderr
    [rollout] = json.loads(result.stdout)["rollouts"]
    assert rollout["outcome_score"] > 0 and rollout["events_score"] > 0
    assert set(rollout["details"]["rubric"]) == {"outcome", "events"}


@pytest.mark.slow
def test_serve_then_check_with_a_rollout(tmp_path, api_key, mock_policy):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "synth_deploy.cli", "serve", "crafter", "--port", str(port),
         "--no-trace"], cwd=tmp_path, env=clean_env(ENVIRONMENT_API_KEY=api_key),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(url, proc, timeout_s=60)
        check = run_cli(tmp_path, "check", url, "--api-key", api_key, "--seeds", "0-2",
                        "--rollout", "--inference-url", mock_policy.url + "/v1", "--model",
                        "mock", "--json", timeout=300)
        assert check.returncode == 0, check.stdout + check.stderr
        report = json.loads(check.stdout)
        assert report["healthy"]
        assert [c["verdict"] for c in report["checks"] if c["name"] == "rollout"] == ["pass"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def test_deploy_dry_run_lists_an_image_of_crafter_and_nothing_from_dev(tmp_path, monkeypatch):
    (tmp_path / ".env").write_text("ENVIRONMENT_API_KEY=sk_env_dryrun_" + "0" * 16 + "\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ENVIRONMENT_API_KEY", raising=False)
    monkeypatch.delenv("SYNTH_TRACES_DB", raising=False)
    result = CliRunner().invoke(cli_app, ["deploy", "crafter", "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    image = json.loads(result.stdout)["plan"]["image"]
    assert "crafter==1.8.3" in image["pip_packages"]  # pinned to what validation ran
    for needed in ("crafter", "numpy", "pillow", "imageio", "opensimplex", "ruamel-yaml",
                   "fastapi", "httpx", "pydantic"):
        assert needed in image["dependencies"]
    assert [p for p in DEV_ONLY if p in image["dependencies"]] == []
    human = CliRunner().invoke(cli_app, ["deploy", "crafter", "--dry-run"])
    assert re.search(r"\d+ Python distributions in the image: .*crafter, .*numpy",
                     human.stdout), human.output


def test_the_rl_config_validates_and_sends_the_env_config(tmp_path):
    result = run_cli(tmp_path, "train", "--config", str(ROOT / "apps" / "crafter" / "configs" /
                                                      "rl.toml"), "--dry-run",
                     SYNTH_API_KEY="sk_test_crafter_dry_run")
    assert result.returncode == 0, result.stderr
    assert "Warning: rl.toml" not in result.stderr  # synth-ai's spellings throughout
    rollout = json.loads(result.stdout)["create"]["json"]["data"]["config"]["rollout"]
    assert rollout["env_name"] == "crafter"
    assert rollout["env_config"] == {"max_turns": 10, "max_actions_per_turn": 5,
                                     "history_turns": 3}


@pytest.fixture
def modal_standin(tmp_path):
    """cwd with a .env and fake Modal credentials; stops the "container" by pid."""
    state = tmp_path / "modal-state"
    state.mkdir()
    key = "sk_env_crafter_" + os.urandom(8).hex()
    (tmp_path / ".env").write_text(f"ENVIRONMENT_API_KEY={key}\n")
    api = ModalAPIStandin("up")  # Modal's API server as far as the network goes
    env = clean_env(MODAL_TOKEN_ID="ak-standin", MODAL_TOKEN_SECRET="as-standin",
                    MODAL_SERVER_URL=api.url, STANDIN_MODAL_STATE_DIR=str(state))
    yield {"key": key, "state": state, "dir": tmp_path, "env": env}
    api.close()
    stop_containers(state)


@pytest.mark.slow
def test_plain_modal_deploy_of_the_app_file_serves_crafter(modal_standin, mock_policy):
    """`modal deploy apps/crafter/task_app.py`: the stand-in imports the file with Modal's own
    code, copies the image's files and serves the web function fenced to the image's pip set
    (crafter and its dependencies, nothing from dev); a real rollout plays through it."""
    deployed = subprocess.run([sys.executable, str(STANDIN_MODAL), "deploy", str(CRAFTER_FILE)],
                              cwd=modal_standin["dir"], env=modal_standin["env"],
                              capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    url = re.search(r"(http://127\.0\.0\.1:\d+) \(unauthenticated\)", deployed.stdout).group(1)
    resp = httpx.post(url + "/rollout", headers={"X-API-Key": modal_standin["key"]},
                      timeout=120, json={
                          "run_id": "modal-crafter", "env": {"seed": 3,
                                                             "config": {"max_turns": 5}},
                          "policy": {"config": {"model": "mock",
                                                "inference_url": mock_policy.url + "/v1"}}})
    assert resp.status_code == 200, resp.text
    assert resp.json()["metrics"]["details"]["turns"] == 5
