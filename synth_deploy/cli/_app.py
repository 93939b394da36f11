"""The `synth-deploy` Typer app, assembled from the command groups.

Each command group lives in its own module with a ``register(app)`` function. Modules import
only typer at the top; the library (and so fastapi, uvicorn, modal) loads inside commands.
"""

from __future__ import annotations

from typing import Annotated

import typer

from synth_deploy.cli import check, deploy, rehearse, runs, taskapp, traces, train, tunnel

app = typer.Typer(
    name="synth-deploy",
    help="Take an RL task app from a laptop to production: serve, tunnel, deploy, check, "
         "trace, train.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help: rich-formatted help would import rich, markdown and pygments at start.
    rich_markup_mode=None,
)


def _print_version(asked: bool) -> None:
    if asked:
        from synth_deploy import __version__

        typer.echo(f"synth-deploy {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True,
        help="Print the version and exit.")] = False,
) -> None:
    pass


for _module in (taskapp, runs, rehearse, check, tunnel, deploy, traces, train):
    _module.register(app)


__all__ = ["app"]
