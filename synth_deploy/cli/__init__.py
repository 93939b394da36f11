"""The `synth-deploy` command: a thin Typer shell over the library.

Each command group lives in its own module with a ``register(app)`` function. Modules import
only typer at the top; the library (and so fastapi, uvicorn, modal) loads inside commands.
"""

from __future__ import annotations

import typer

from synth_deploy.cli import check, deploy, runs, taskapp, traces, train, tunnel

app = typer.Typer(
    name="synth-deploy",
    help="Take an RL task app from a laptop to production: serve, tunnel, deploy, check, "
         "trace, train.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help: rich-formatted help imports ~180 ms of rich, markdown and pygments.
    rich_markup_mode=None,
)

for _module in (taskapp, runs, check, tunnel, deploy, traces, train):
    _module.register(app)


def main() -> None:
    app()


__all__ = ["app", "main"]
