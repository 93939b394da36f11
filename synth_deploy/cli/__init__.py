"""The `synth-deploy` command: a thin Typer shell over the library (the app: `_app`).

`synth-deploy --help` is the one invocation answered without Typer: importing Typer and the
command modules costs several times the interpreter's own start, so the root help is printed
from `help.txt`, Typer's own rendering of it at 80 columns, kept equal to the live one by
tests/test_cli_conventions.py (`python -m synth_deploy.cli.help_text` rewrites it).
"""

from __future__ import annotations

import os
import sys

from synth_deploy._lazy import lazy_attributes

HELP_FILE = os.path.join(os.path.dirname(__file__), "help.txt")

__getattr__ = lazy_attributes(__name__, {"app": "_app"})


def main() -> None:
    if sys.argv[1:] == ["--help"]:
        with open(HELP_FILE, encoding="utf-8") as file:
            sys.stdout.write(file.read())
        return
    from synth_deploy.cli._app import app

    app()


__all__ = ["HELP_FILE", "app", "main"]
