"""What every command shares: error mapping, JSON output, consoles, seed ranges, options.

Exit codes (documented in the README):
    0 success · 1 failure (unhealthy app, failed job...) · 2 usage error (bad flag, file, value)
    3 unreachable (check: DNS, connect, TLS) · 4 job still running at --poll-timeout (train)
    130 interrupted
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from synth_deploy.errors import SynthDeployError, UsageError

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130

EnvFilesOption = Annotated[
    list[Path] | None,
    typer.Option("--env-file", help="A .env file to load (repeatable; later files win).",
                 show_default=False, metavar="FILE"),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document for machines.")]
TraceDbOption = Annotated[str | None, typer.Option(
    "--trace-db", help="Trace database URL or SQLite path (default: $SYNTH_TRACES_DB, else "
                       "traces/v3/synth_ai.db).", show_default=False)]
NoTraceOption = Annotated[bool, typer.Option("--no-trace", help="Do not record traces.")]


def console(stderr: bool = False):
    """A rich Console, created on first use so `--help` does not pay for it."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=False)


def print_json(data: Any, *, one_line: bool = False) -> None:
    sys.stdout.write(json.dumps(data, indent=None if one_line else 2, default=str) + "\n")
    sys.stdout.flush()


def escape(text: object) -> str:
    """Outside text (model output, server and child-process messages) made safe to embed in
    rich markup: "[/INST]" or "arr[i]" print as written instead of vanishing or raising."""
    from rich.markup import escape as rich_escape

    return rich_escape(str(text))


def warn(message: str) -> None:
    console(stderr=True).print(f"[yellow]warning:[/yellow] {escape(message)}", markup=True)


@contextmanager
def handling_errors(json_output: bool = False) -> Iterator[None]:
    """Turn the kit's errors into a message with the fix and a documented exit code."""
    try:
        yield
    except SynthDeployError as exc:
        if json_output:
            # One line: it may end an NDJSON stream (`train --stream-format json`).
            print_json({"ok": False, "error": {"type": type(exc).__name__,
                                               "message": exc.message, "hint": exc.hint}},
                       one_line=True)
        else:
            err = console(stderr=True)
            from rich.text import Text

            # Text, not markup: messages hold brackets ("[signed-by=...]") that markup eats.
            # soft_wrap keeps a long file:line or URL on one line, greppable and clickable.
            err.print(Text.assemble(("error: ", "red"), exc.message), soft_wrap=True)
            if exc.hint:
                err.print(Text.assemble(("  hint: ", "dim"), exc.hint), soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        console(stderr=True).print("interrupted")
        raise typer.Exit(EXIT_INTERRUPTED) from None


def resolve_env(env_files: list[Path] | None):
    """The `Env` for ``--env-file`` (see `synth_deploy.env` for precedence)."""
    from synth_deploy.env import load_env

    return load_env(env_files or ())


def resolve_traces(trace_db: str | None, no_trace: bool, env):
    """The trace setting for ``--trace-db``/``--no-trace`` (None: not recorded)."""
    if no_trace:
        return None
    from synth_deploy.tracing import resolve_trace_db

    return resolve_trace_db(trace_db, env)


def traces_where(setting) -> str:
    """Where traces go, said for humans."""
    return "off (--no-trace)" if setting is None else f"{setting.display} ({setting.source})"


def parse_seeds(text: str) -> list[int]:
    """'0-9', '1,3,5' and mixes like '0-4,10,12-13' → a list of seeds, in order, no repeats."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        lo, sep, hi = part.partition("-") if not part.startswith("-") else (part, "", "")
        try:
            if sep:
                start, end = int(lo), int(hi)
                if end < start:
                    raise UsageError(f"seed range {part!r} runs backwards",
                                     hint=f"write it as {end}-{start}")
                if end - start > 100_000:
                    raise UsageError(f"seed range {part!r} is too large (max 100000 seeds)")
                seeds.extend(range(start, end + 1))
            else:
                seeds.append(int(part))
        except ValueError:
            raise UsageError(f"cannot read seeds {text!r}: {part!r} is not a number or range",
                             hint="use forms like 0-9, 1,3,5 or 0-4,10") from None
    if not seeds:
        raise UsageError(f"no seeds in {text!r}", hint="use forms like 0-9, 1,3,5 or 0-4,10")
    return list(dict.fromkeys(seeds))


__all__ = [
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "EnvFilesOption",
    "JsonOption",
    "NoTraceOption",
    "TraceDbOption",
    "console",
    "escape",
    "handling_errors",
    "parse_seeds",
    "print_json",
    "resolve_env",
    "resolve_traces",
    "traces_where",
    "warn",
]
