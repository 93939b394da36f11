"""The root help as Typer renders it at 80 columns: what `synth-deploy --help` prints.

    python -m synth_deploy.cli.help_text     # rewrite synth_deploy/cli/help.txt after a
                                             # command or its one-line help changes
"""

from __future__ import annotations

from typer.testing import CliRunner

from synth_deploy.cli import HELP_FILE
from synth_deploy.cli._app import app


def rendered_help() -> str:
    """Typer's own `--help` for the root command in an 80-column terminal (Typer wraps
    at 78)."""
    result = CliRunner().invoke(app, ["--help"], terminal_width=78, prog_name="synth-deploy")
    if result.exit_code != 0:
        raise RuntimeError(f"`synth-deploy --help` exited {result.exit_code}: {result.output}")
    return result.output


if __name__ == "__main__":
    with open(HELP_FILE, "w", encoding="utf-8") as file:
        file.write(rendered_help())
    print(f"wrote {HELP_FILE}")
