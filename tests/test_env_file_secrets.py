"""A malformed .env line (issue 12): the error names the file, the line and the variable, and
never a value (`OPENAI_API_KEY sk-...`, no "=", must not be echoed). Library and CLI."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from synth_deploy.cli import app
from synth_deploy.env import parse_env_file
from synth_deploy.errors import EnvFileError

SECRET = "sk-proj-Zq81secretvalue0042"


@pytest.mark.parametrize("line, names", [
    (f"OPENAI_API_KEY {SECRET}", "the line for OPENAI_API_KEY"),
    (f"export GROQ_API_KEY {SECRET}", "the line for GROQ_API_KEY"),
    (f'TOKEN="{SECRET}', "the line for TOKEN"),
    (f"{SECRET} OPENAI_API_KEY", "cannot parse the line"),
])
def test_a_bad_line_is_named_by_file_line_and_variable_only(tmp_path, line, names):
    path = tmp_path / "bad.env"
    path.write_text(f"# keys\nGOOD=1\n{line}\n")
    with pytest.raises(EnvFileError) as err:
        parse_env_file(path)
    shown = str(err.value)
    assert f"{path}:3:" in shown and names in shown
    assert SECRET not in shown and SECRET[:8] not in shown


def test_an_invalid_name_is_not_echoed(tmp_path):
    path = tmp_path / "bad.env"
    path.write_text(f"{SECRET}!=value\n")
    with pytest.raises(EnvFileError) as err:
        parse_env_file(path)
    assert f"{path}:1:" in str(err.value) and SECRET[:8] not in str(err.value)


def test_the_cli_shows_the_same_error_and_no_value(tmp_path):
    path = tmp_path / "prod.env"
    path.write_text(f"ENVIRONMENT_API_KEY=sk_env_fine_0123456789\nOPENAI_API_KEY {SECRET}\n")
    result = CliRunner().invoke(app, ["traces", "where", "--env-file", str(path)])
    assert result.exit_code == 2, result.output
    assert f"{path}:2" in result.output and "OPENAI_API_KEY" in result.output
    assert SECRET not in result.output and "sk-proj" not in result.output
