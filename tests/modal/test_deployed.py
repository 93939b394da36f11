"""`synth-deploy deployed` and `stop`: the kit's Modal apps listed and stopped through the
stand-in `modal` CLI (its `modal app list --json` and `modal app stop` as Modal 1.6's), with
"containers" it really started and really kills. Nothing here reaches Modal."""

from __future__ import annotations

import json
import time

import pytest
from standins.modal_helpers import COMMAND as STANDIN
from standins.modal_helpers import alive
from typer.testing import CliRunner

from synth_deploy.cli import app as cli_app
from synth_deploy.env import load_env
from synth_deploy.errors import DeployError
from synth_deploy.modal import ModalCLI, deployed_apps


def cli(*args: str):
    return CliRunner().invoke(cli_app, [*args, "--modal-cli", STANDIN], catch_exceptions=False)


def containers(state) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for line in (state / "containers.jsonl").read_text().splitlines():
        c = json.loads(line)
        found.setdefault(c["app"], []).append(c["pid"])
    return found


@pytest.mark.slow
def test_the_kits_deployed_apps_are_listed_and_one_is_stopped_by_name(standin):
    for extra in ((), ("--name", "hand-named")):
        deployed = cli("deploy", "math", "--no-check", *extra)
        assert deployed.exit_code == 0, deployed.output
    [math_pid] = containers(standin["state"])["synth-math"]

    listed = cli("deployed", "--json")
    assert listed.exit_code == 0, listed.output
    [app] = json.loads(listed.stdout)["apps"]  # the kit's: named synth-<app id>
    assert (app["name"], app["state"], app["containers"]) == ("synth-math", "deployed", 1)
    assert app["modal_app_id"].startswith("ap-") and app["stopped_at"] is None
    every = json.loads(cli("deployed", "--all", "--json").stdout)["apps"]
    assert sorted(a["name"] for a in every) == ["hand-named", "synth-math"]
    table = cli("deployed").output
    assert "synth-math" in table and "deployed" in table and "hand-named" not in table

    # Without a terminal, nothing is stopped unless asked outright.
    refused = cli("stop", "math")
    assert refused.exit_code == 2 and "pass --yes" in refused.output
    assert alive(math_pid)

    stopped = cli("stop", "math", "--yes", "--json")  # the task app's id names its Modal app
    assert stopped.exit_code == 0, stopped.output
    result = json.loads(stopped.stdout)
    assert result["name"] == "synth-math" and result["stopped"]
    assert result["containers_terminated"] == 1
    said = " ".join(result["consequences"])
    assert "rollouts in flight are cut" in said and "without draining" in said
    assert "the trace Volume synth-math-traces is not the app's and is kept" in said
    assert "synth-deploy traces pull synth-math" in said
    deadline = time.monotonic() + 10
    while alive(math_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(math_pid)
    assert standin["key"] not in stopped.output + listed.output

    after = json.loads(cli("deployed", "--json").stdout)["apps"]
    assert [(a["state"], a["containers"]) for a in after] == [("stopped", 0)]
    assert after[0]["stopped_at"] is not None
    again = cli("stop", "synth-math", "--yes")  # a Modal app name works too
    assert again.exit_code == 0 and "was already stopped" in again.output
    [other_pid] = containers(standin["state"])["hand-named"]
    assert alive(other_pid)  # the other app runs on


def test_stopping_an_app_modal_does_not_have_names_the_fix(standin):
    missing = cli("stop", "synth-nothing", "--yes")
    assert missing.exit_code != 0
    assert "Modal has no app named 'synth-nothing'" in missing.output
    assert "synth-deploy deployed" in missing.output
    # The app's own key is not needed to name it, nor to stop it.
    (standin["dir"] / ".env").unlink()
    by_id = cli("stop", "math", "--yes")
    assert "Modal has no app named 'synth-math'" in by_id.output, by_id.output


def test_listing_is_bounded_when_modal_never_answers(standin, monkeypatch):
    monkeypatch.setenv("STANDIN_MODAL_MODE", "hang")
    started = time.monotonic()
    with pytest.raises(DeployError) as failed:
        deployed_apps(load_env(), cli=ModalCLI(STANDIN.split()), timeout_s=2)
    assert "did not finish within 2s" in str(failed.value)
    assert time.monotonic() - started < 15


def test_listing_without_a_token_says_how_to_get_one(standin, monkeypatch):
    monkeypatch.delenv("MODAL_TOKEN_ID")
    monkeypatch.delenv("MODAL_TOKEN_SECRET")
    monkeypatch.setenv("HOME", str(standin["dir"]))  # no ~/.modal.toml
    result = cli("deployed")
    assert result.exit_code != 0 and "modal token new" in result.output
