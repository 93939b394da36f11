"""`synth-deploy deploy` end to end against a stand-in `modal` CLI, and the real one without a
token. Nothing here can reach Modal: every run points MODAL_SERVER_URL at a loopback stand-in
(tests/standins/modal_api.py) or a closed loopback port, the stand-in CLI connects nowhere
else, and the real CLI only runs without credentials.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from standins.modal_helpers import COMMAND as STANDIN
from standins.modal_helpers import stop_containers
from typer.testing import CliRunner

from synth_deploy.cli import app as cli_app
from synth_deploy.env import parse_env_file
from synth_deploy.handoff import env_files_for_child
from synth_deploy.health import CheckOptions, RolloutOptions, check
from synth_deploy.modal import SOURCE_EXCLUDED_PACKAGES, ModalCLI
from synth_deploy.tracing import merge_trace_file, open_trace_store

ROOT = Path(__file__).resolve().parents[2]
MATH_FILE = ROOT / "apps" / "math" / "task_app.py"
CLOSED_PORT_URL = "http://127.0.0.1:9"

BROKEN_APP = '''
from synth_deploy.taskapp import TaskApp

task_app = TaskApp("brokenmath", name="Broken math", description="Its rollout always fails.")


@task_app.rollout
async def rollout(request, ctx):
    raise RuntimeError("rollout is broken")
'''


def _run(*args: str):
    return CliRunner().invoke(cli_app, ["deploy", *args, "--modal-cli", STANDIN],
                              catch_exceptions=False)


@pytest.mark.slow
def test_deploy_end_to_end(standin, mock_policy, tmp_path):
    result = _run("math", "--check-timeout", "30", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    url = doc["url"]
    assert url.startswith("http://127.0.0.1:")
    assert doc["local_check"]["healthy"] and doc["remote_check"]["healthy"]
    assert parse_env_file(standin["dir"] / ".env")["TASK_APP_URL"] == url
    assert standin["key"] not in result.output
    # The "container" serves from the image's files only, fenced to its pip set: a real
    # rollout through it must work, and a wrong key must be refused.
    report = check(url, standin["key"], CheckOptions(
        seeds=(3,), rollout=RolloutOptions(inference_url=mock_policy.url + "/v1", model="mock")))
    assert report.healthy, report.to_dict()
    assert httpx.get(url + "/task_info", headers={"X-API-Key": "sk_env_nope_000000000"},
                     timeout=5).status_code == 403
    # No SYNTH_TRACES_DB: the rollout's trace goes to the app's trace Volume, as the plan
    # says (and to nothing shared on the container's disk): the container drains, makes its
    # last copy and commits, and `traces pull`'s merge stores the session at home.
    stop_containers(standin["state"])
    [copy] = list((standin["state"] / "volumes").rglob("*.log"))
    assert not list(standin["state"].rglob("*.db.sessions"))
    with open_trace_store(tmp_path / "home.db") as store:
        assert merge_trace_file(store, copy).added == 1
        assert [s.seed for s in store.list_sessions()] == [3]
    # Serving (a rollout included) asked for no synth_deploy package the image leaves out,
    # not even in an import that would have been caught.
    [imports] = list(standin["state"].rglob("imports.json"))
    asked = json.loads(imports.read_text())["synth_deploy"]
    assert {"synth_deploy.modal._container", "synth_deploy.taskapp"} <= set(asked)
    assert [m for m in asked if _subpackage(m) in SOURCE_EXCLUDED_PACKAGES] == []


def _subpackage(module: str) -> str:
    """"synth_deploy.health._check" -> "health"."""
    return module.partition(".")[2].partition(".")[0]


@pytest.mark.slow
def test_modal_app_is_an_app_only_when_modals_cli_imports_the_file(standin):
    # A plain import, modal loaded or not, gives None: `serve`, smoke runs and the container
    # never build an App.
    code = ("import importlib.util, sys; import modal; "
            f"sys.path.insert(0, {str(MATH_FILE.parent)!r}); "
            f"spec = importlib.util.spec_from_file_location('math_app', {str(MATH_FILE)!r}); "
            "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module); "
            "print(module.app, 'modal.cli.import_refs' in sys.modules)")
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=60, env=os.environ)
    assert plain.stdout.split() == ["None", "False"], plain.stderr
    # Modal's own import code (the stand-in `modal deploy` uses it) finds a real App, with
    # the web function, built from ./.env.
    found = _standin_modal(["deploy", str(MATH_FILE)], STANDIN_MODAL_MODE="no-url")
    assert found.returncode == 0, found.stdout
    assert "Created function web." in found.stdout


@pytest.mark.slow
def test_modal_child_resolves_the_env_files_it_is_handed(standin):
    (standin["dir"] / ".env").unlink()
    prod = standin["dir"] / "prod.env"
    prod.write_text("ENVIRONMENT_API_KEY=sk_env_from_prod_file_0000\n")
    # "fail" prints the App's secret values: they came from the handed-over file.
    run = _standin_modal(["deploy", str(MATH_FILE)], STANDIN_MODAL_MODE="fail",
                         **env_files_for_child([prod]))
    assert "sk_env_from_prod_file_0000" in run.stdout, run.stdout
    missing = _standin_modal(["deploy", str(MATH_FILE)], STANDIN_MODAL_MODE="fail")
    assert missing.returncode != 0
    assert "ENVIRONMENT_API_KEY is not set" in missing.stdout + missing.stderr


def _standin_modal(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*shlex.split(STANDIN), *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **env}, stdin=subprocess.DEVNULL)


def test_dry_run_prints_the_plan_and_sends_nothing(standin):
    result = _run("math", "--dry-run", "--name", "synth-math-staging")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "synth-math-staging" in out and "expected URL" in out
    assert "ENVIRONMENT_API_KEY = **** (sha256:" in out and standin["key"] not in out
    assert "pip_install fastapi==" in out
    assert "traces go to the Modal Volume synth-math-staging-traces" in out
    # Which code the containers will run, as their /health and sessions will say it.
    from synth_deploy.taskapp.registry import load_app

    identity = load_app("math").build_config().identity
    assert f"code          version 1, digest {identity.digest} (2 file(s): math_problems.py, " \
        "task_app.py)" in out
    assert not (standin["state"] / "pids").exists()
    assert "TASK_APP_URL" not in (standin["dir"] / ".env").read_text()


def test_the_plan_warns_when_settings_promise_more_than_rehearse_measured(standin):
    # What `rehearse --app math` keeps when its ramp found the limit (at 4 here): the math
    # app's ModalSettings promise more concurrent inputs a container.
    record = standin["dir"] / ".synth-deploy" / "capacity.json"
    record.parent.mkdir()
    record.write_text(json.dumps({"math": {
        "app_id": "math", "sustained": 4, "knee": 2, "rollouts_per_s": 9.5, "limited": True,
        "measured_at": "2026-11-26 21:00"}}))
    result = _run("math", "--dry-run")
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert re.search(r"ModalSettings\.concurrent_inputs = \d+ promises more than one process "
                     r"held 4 rollouts at once .* set it between 2 .* and 4", said), said
    record.write_text(json.dumps({"math": {**json.loads(record.read_text())["math"],
                                           "limited": False}}))  # a lower bound: no warning
    assert "promises more" not in _run("math", "--dry-run").output


def test_a_hand_edited_capacity_record_is_ignored_by_the_plan(standin):
    record = standin["dir"] / ".synth-deploy" / "capacity.json"
    record.parent.mkdir()
    record.write_text(json.dumps({"math": {
        "app_id": "math", "sustained": "4", "knee": None, "rollouts_per_s": 9.5,
        "limited": True, "measured_at": "2026-11-26 21:00"}}))
    result = _run("math", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output and "promises more" not in result.output


def test_a_broken_app_never_reaches_modal(standin):
    app_dir = standin["dir"] / "apps" / "brokenmath"
    app_dir.mkdir(parents=True)
    (app_dir / "task_app.py").write_text(BROKEN_APP)
    result = _run(str(app_dir / "task_app.py"))
    assert result.exit_code == 1
    assert "local validation failed, nothing was deployed" in result.output
    assert "RuntimeError: rollout is broken" in result.output
    assert not (standin["state"] / "pids").exists()


def test_deploy_step_is_bounded(standin, monkeypatch):
    monkeypatch.setenv("STANDIN_MODAL_MODE", "hang")
    started = time.monotonic()
    result = _run("math", "--no-check", "--timeout", "2")
    assert result.exit_code == 1
    assert time.monotonic() - started < 15
    assert "did not finish within 2s" in result.output
    assert "Connecting to Modal" in result.output


def test_no_url_in_output_says_so_and_shows_it(standin, monkeypatch):
    monkeypatch.setenv("STANDIN_MODAL_MODE", "no-url")
    result = _run("math", "--no-check")
    assert result.exit_code == 1
    assert "names no web URL" in result.output
    assert "App deployed in" in result.output  # Modal's output is shown
    assert "TASK_APP_URL" not in (standin["dir"] / ".env").read_text()


def test_modal_failure_output_is_redacted(standin, monkeypatch):
    monkeypatch.setenv("STANDIN_MODAL_MODE", "fail")
    result = _run("math", "--no-check")
    assert result.exit_code == 1
    assert "modal deploy failed (exit 1)" in result.output
    assert "bad environment" in result.output
    assert standin["key"] not in result.output


def _no_token_env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MODAL_") and k != "STANDIN_MODAL_MODE"}
    # No credentials anywhere (empty HOME: no ~/.modal.toml), and a closed loopback port as
    # the server, so even a bug could not reach Modal.
    return {**env, "HOME": str(home), "MODAL_SERVER_URL": CLOSED_PORT_URL}


def test_no_token_gives_the_fix_within_seconds(tmp_path):
    (tmp_path / ".env").write_text("ENVIRONMENT_API_KEY=sk_env_notoken_1234567890\n")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", "from synth_deploy.cli import main; main()",
                           "deploy", "math"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env=_no_token_env(tmp_path))
    elapsed = time.monotonic() - started
    assert proc.returncode == 1, proc.stderr
    assert "modal token new" in proc.stderr and "MODAL_TOKEN_ID" in proc.stderr
    assert elapsed < 30  # not the minute Modal's client waits without a network


def test_real_modal_cli_without_token_maps_to_the_fix(tmp_path):
    (tmp_path / ".env").write_text("ENVIRONMENT_API_KEY=sk_env_notoken_1234567890\n")
    result = ModalCLI().run(["deploy", str(ROOT / "apps" / "math" / "task_app.py")],
                            env=_no_token_env(tmp_path), cwd=str(tmp_path), timeout_s=60)
    assert result.returncode != 0
    error = result.error("modal deploy")
    assert "Token missing" in "\n".join(result.output)
    assert "Modal has no token" in error.message
    assert "modal token new" in error.hint and "MODAL_TOKEN_ID" in error.hint


def test_logs_of_a_deployed_app_come_from_modal_with_its_key_masked(standin):
    # What Modal keeps of the deployed "container"'s output (the stand-in's state), one line
    # of which quotes the app's key as a careless app might.
    container = standin["state"] / "container-synth-math-1"
    container.mkdir()
    (container / "container.log").write_text(
        f"starting\nrollout r1 ok\nauth header was {standin['key']}\n")
    result = CliRunner().invoke(cli_app, ["logs", "math", "--tail", "2", "--modal-cli",
                                          STANDIN], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "rollout r1 ok" and lines[1].startswith("auth header was "), lines
    assert standin["key"] not in result.output
    assert "starting" not in result.output
    missing = CliRunner().invoke(cli_app, ["logs", "synth-nothing", "--modal-cli", STANDIN],
                                 catch_exceptions=False)
    assert missing.exit_code != 0
    assert "Modal has no deployed app named 'synth-nothing'" in missing.output
    assert "synth-deploy deploy APP" in missing.output
