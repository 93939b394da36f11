"""What every command has in common (issue 14): --version, one spelling of argument names in
usage lines, and one prefix for errors, the kit's and Click's alike."""

from __future__ import annotations

import re

import typer
from processes import run_cli
from typer.testing import CliRunner

import synth_deploy
from synth_deploy.cli import app


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
