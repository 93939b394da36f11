"""An app that declares sandboxes, deployed: the plan shows their settings and names the
Modal app they belong to, and the deployed container (the stand-in's) runs its rollouts'
code in Modal's sandboxes (tests/standins/modal_sandbox.py), ending each with its rollout."""

from __future__ import annotations

import json

import pytest
from standins.modal_helpers import COMMAND as STANDIN
from standins.modal_helpers import stop_containers
from standins.modal_sandbox import ModalSandboxStandin
from typer.testing import CliRunner

from synth_deploy.cli import app as cli_app
from synth_deploy.env import load_env
from synth_deploy.handoff import SANDBOX_APP_VAR
from synth_deploy.health import CheckOptions, RolloutOptions, check
from synth_deploy.modal import build_plan
from synth_deploy.taskapp.registry import load_app


def test_the_plan_shows_the_sandbox_settings_and_hands_the_app_name_over(api_key):
    env = load_env(environ={"ENVIRONMENT_API_KEY": api_key})
    plan = build_plan(load_app("code"), env)
    shown = plan.to_dict()["sandbox"]
    assert shown["backend"] == "modal.Sandbox" and shown["modal_app"] == "synth-code"
    assert (shown["image"], shown["memory_mb"], shown["network"]) == (
        "python:3.12-slim", 256, "off")
    assert plan.env[SANDBOX_APP_VAR] == "synth-code"
    math = build_plan(load_app("math"), env)
    assert math.to_dict()["sandbox"] is None and SANDBOX_APP_VAR not in math.env


def test_dry_run_prints_the_sandboxes(standin):
    result = CliRunner().invoke(cli_app, ["deploy", "code", "--dry-run"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("Sandboxes"))
    assert "modal.Sandbox in app synth-code" in line and "image python:3.12-slim" in line
    assert "memory 256 MiB" in line and "network off" in line


@pytest.mark.slow
def test_the_deployed_code_app_runs_its_tests_in_modal_sandboxes(standin, mock_policy):
    result = CliRunner().invoke(cli_app, ["deploy", "code", "--modal-cli", STANDIN,
                                          "--check-timeout", "60", "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    url = json.loads(result.stdout)["url"]
    report = check(url, standin["key"], CheckOptions(
        seeds=(0, 2), rollout=RolloutOptions(inference_url=mock_policy.url + "/v1",
                                             model="mock")))
    assert report.healthy, report.to_dict()
    sandboxes = ModalSandboxStandin(standin["state"] / "sandboxes")
    made = sorted(p.name for p in (sandboxes.state / "sandboxes").iterdir())
    assert made, "the container made no sandbox"
    records = [sandboxes.record(i) for i in made]
    assert {r["tags"]["synth_deploy_app"] for r in records} == {"code"}
    assert all(r["image"][0] == "from python:3.12-slim" for r in records)
    assert [i for i in made if sandboxes.processes(i)] == []  # each ended with its rollout
    stop_containers(standin["state"])
