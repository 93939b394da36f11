"""What every command has in common (issue 14): --version, one spelling of argument names in
usage lines, and one prefix for errors, the kit's and Click's alike."""

from __future__ import annotations

import re

import pytest
import typer
from processes import run_cli
from typer.testing import CliRunner

import synth_deploy
import synth_deploy.cli
from synth_deploy.cli import app
from synth_deploy.env import missing_key_hint


def command_paths() -> list[list[str]]:
    """Every command and subcommand, e.g. ["smoke"], ["traces", "ls"]."""
    paths: list[list[str]] = []

    def walk(command, prefix: list[str]) -> None:
        for name, sub in getattr(command, "commands", {}).items():
            if getattr(sub, "commands", None):
                walk(sub, [*prefix, name])
            else:
                paths.append([*prefix, name])

    walk(typer.main.get_command(app), [])
    return paths


def test_version_prints_the_package_version(tmp_path):
    result = run_cli(tmp_path, "--version")
    assert result.returncode == 0
    assert result.stdout == f"synth-deploy {synth_deploy.__version__}\n"


def test_usage_lines_name_arguments_one_way():
    paths = command_paths()
    assert ["traces", "show"] in paths and ["modal-serve"] in paths
    for path in paths:
        result = CliRunner().invoke(app, [*path, "--help"])
        usage = next(line for line in result.stdout.splitlines() if line.startswith("Usage:"))
        names = re.findall(r"[{\[]([^}\]]+)[}\]]", usage.split(" ".join(path), 1)[1])
        for name in names:
            assert name == "OPTIONS" or re.fullmatch(r"[A-Z][A-Z_]*", name), (path, usage)


@pytest.mark.slow
def test_errors_start_the_same_way_wherever_they_come_from(tmp_path):
    (tmp_path / "bad.db").write_text("not a database\n")
    failures = [
        run_cli(tmp_path, "--nope"),  # Click's usage error
        run_cli(tmp_path, "smoke", "nosuchapp", "--no-trace"),  # the kit's error tree
        run_cli(tmp_path, "traces", "where", "--trace-db", "bad.db"),  # a report's error
    ]
    for result in failures:
        assert result.returncode != 0
        starts = [line.split(":")[0] for line in result.stderr.splitlines()
                  if line.lower().startswith("error")]
        assert starts == ["Error"], result.stderr


def test_every_client_of_an_app_says_the_same_when_its_key_is_missing(tmp_path, math_server,
                                                                     monkeypatch):
    monkeypatch.chdir(tmp_path)  # no .env here, and none of the kit's variables
    for name in ("ENVIRONMENT_API_KEY", "SYNTH_API_KEY", "TASK_APP_URL", "SYNTH_TRACES_DB"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLUMNS", "400")
    (tmp_path / "rl.toml").write_text(
        '[algorithm]\ntype = "online"\nmethod = "policy_gradient"\n'
        '[policy]\nmodel_name = "Qwen/Qwen3-4B"\n')
    (tmp_path / "k.env").write_text("SYNTH_API_KEY=sk_synth_test_0000\n")
    said = {}
    for command in (["check", math_server.url], ["smoke", math_server.url],
                    ["tunnel", "--url", math_server.url],
                    ["train", "--config", "rl.toml", "--task-url", math_server.url,
                     "--env-file", "k.env", "--yes"]):
        result = CliRunner().invoke(app, command)
        said[command[0]] = " ".join(result.output.split())
    hint = " ".join(missing_key_hint().split())
    check_hint = " ".join(missing_key_hint(flag="--api-key").split())
    assert {name: (check_hint if name == "check" else hint) in text
            for name, text in said.items()} == dict.fromkeys(said, True), said


def test_root_help_is_typers_own_rendering():
    # `synth-deploy --help` prints help.txt without importing Typer; a command added or
    # reworded without `python -m synth_deploy.cli.help_text` fails here.
    from synth_deploy.cli import help_text

    with open(synth_deploy.cli.HELP_FILE, encoding="utf-8") as file:
        assert file.read() == help_text.rendered_help()


def test_root_help_starts_without_typer_or_the_commands(tmp_path):
    result = run_cli(tmp_path, "--help")
    assert result.returncode == 0
    with open(synth_deploy.cli.HELP_FILE, encoding="utf-8") as file:
        assert result.stdout == file.read()
    probe = ("import sys; sys.argv = ['synth-deploy', '--help']\n"
             "from synth_deploy.cli import main; main()\n"
             "heavy = sorted(m for m in ('typer', 'click', 'fastapi', 'uvicorn', 'modal', "
             "'synth_deploy.cli._app') if m in sys.modules)\n"
             "print('loaded:', heavy, file=sys.stderr)")
    import subprocess
    import sys

    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=60)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stderr.strip() == "loaded: []"
