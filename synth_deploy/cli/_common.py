"""What every command shares: error mapping, JSON output, consoles, tables, seed ranges,
options.

Exit codes (documented in the README):
    0 success · 1 failure (unhealthy app, failed job...) · 2 usage error (bad flag, file, value)
    3 unreachable (check, rehearse: DNS, connect, TLS) · 4 job still running at
    --poll-timeout (train) · 130 interrupted
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
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
ApiKeyOption = Annotated[str | None, typer.Option(
    "--api-key", help="The key to send. Default: ENVIRONMENT_API_KEY from the environment "
                      "or .env.", show_default=False)]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document for machines.")]
TraceDbOption = Annotated[str | None, typer.Option(
    "--trace-db", help="Trace database URL or SQLite path (default: $SYNTH_TRACES_DB, else "
                       "traces/v3/synth_ai.db).", show_default=False)]
NoTraceOption = Annotated[bool, typer.Option("--no-trace", help="Do not record traces.")]
MaxRolloutsOption = Annotated[int | None, typer.Option(
    "--max-rollouts", min=1, help="Rollouts the app runs at once; beyond, 503 + Retry-After "
                                  "(default: $SYNTH_DEPLOY_MAX_ROLLOUTS, else 10000). Also "
                                  "caps /openenv sessions, unless the environment's own "
                                  "max_sessions is lower.",
    show_default=False, metavar="N")]
HeadAfterOption = Annotated[float | None, typer.Option(
    "--head-after", min=0.1, help="Seconds before a running rollout's 200 head is sent, below "
                                  "the shortest proxy limit on the path (default: "
                                  "$SYNTH_DEPLOY_HEAD_AFTER_S, else 20).",
    show_default=False, metavar="S")]
HeartbeatOption = Annotated[float | None, typer.Option(
    "--heartbeat", min=0.1, help="Seconds between the spaces a long rollout sends after its "
                                 "head (default: $SYNTH_DEPLOY_HEARTBEAT_S, else 15).",
    show_default=False, metavar="S")]
PricesOption = Annotated[Path | None, typer.Option(
    "--prices", help="A price table (TOML: US dollars per million tokens, per model) for a cost "
                     "estimate (default: $SYNTH_PRICES).", show_default=False, metavar="FILE")]


def console(stderr: bool = False):
    """A rich Console, created on first use so `--help` does not pay for it.

    Everything it prints reaches the terminal without control characters: outside text (a
    stored run id or model name, a server's message, a model's reply) holding an escape
    sequence could retitle the terminal, clear it or forge a link. Each is shown as its escape
    (``\\x1b``); the styles rich adds itself are kept."""
    out = _control_free_console()(stderr=stderr, highlight=False, soft_wrap=False)
    out.push_render_hook(_control_free_hook())
    return out


@functools.cache
def _control_free_console() -> Any:
    from rich.console import Console

    class ControlFreeConsole(Console):
        """A Console whose printed strings have their controls escaped before rich reads
        them: rich drops a bell or a backspace itself, and the hook never sees it."""

        def render_str(self, text: str, **kwargs: Any) -> Any:
            return super().render_str(terminal_safe(text), **kwargs)

    return ControlFreeConsole


# C0 controls but tab and newline, DEL, and the C1 controls (\x9b is a one-byte CSI).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal_safe(text: str) -> str:
    """``text`` with every control character but tab and newline shown as its escape."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


@functools.cache
def _control_free_hook() -> Any:
    from rich.console import RenderHook
    from rich.measure import Measurement
    from rich.segment import Segment

    class ControlFree:
        """A renderable's segments with `terminal_safe` text (rich's own controls kept)."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __rich_console__(self, out: Any, options: Any) -> Any:
            for segment in out.render(self.inner, options):
                if segment.control or not _CONTROL.search(segment.text):
                    yield segment
                else:
                    yield Segment(terminal_safe(segment.text), segment.style)

        def __rich_measure__(self, out: Any, options: Any) -> Any:
            return Measurement.get(out, options, self.inner)

    class Hook(RenderHook):
        def process_renderables(self, renderables: list[Any]) -> list[Any]:
            return [ControlFree(r) for r in renderables]

    return Hook()


def print_json(data: Any, *, one_line: bool = False) -> None:
    sys.stdout.write(json.dumps(data, indent=None if one_line else 2, default=str) + "\n")
    sys.stdout.flush()


def escape(text: object) -> str:
    """Outside text (model output, server and child-process messages) made safe to embed in
    rich markup: "[/INST]" or "arr[i]" print as written instead of vanishing or raising."""
    from rich.markup import escape as rich_escape

    return rich_escape(str(text))


def warn(message: str) -> None:
    console(stderr=True).print(f"[yellow]Warning:[/yellow] {escape(message)}", markup=True,
                               soft_wrap=True)


def print_error(message: str, hint: str | None = None) -> None:
    """The one way an error is shown: "Error: <what>" and "  hint: <fix>" on stderr, each kept
    whole (soft wrap: a long file:line or URL stays on one line, greppable and clickable).
    Click's own usage errors ("Error: No such option") read the same."""
    from rich.text import Text

    from synth_deploy.env import redact_userinfo

    err = console(stderr=True)
    # Text, not markup: messages hold brackets ("[signed-by=...]") that markup eats. A URL's
    # userinfo (user:password@, token@) never reaches the screen, whoever built the message.
    err.print(Text.assemble(("Error: ", "red"), redact_userinfo(message)), soft_wrap=True)
    if hint:
        err.print(Text.assemble(("  hint: ", "dim"), redact_userinfo(hint)), soft_wrap=True)


@dataclass(frozen=True)
class Column:
    """A table column. Its header is never cut; ``wrap`` cells fold onto more lines (no
    narrower than ``min_width``) instead of being cut; ``optional`` columns are dropped (the
    last first) when the terminal is too narrow to show every column whole, or to give a
    ``wrap`` column the ``prefer_width`` its cells need (when even dropping them all cannot,
    they stay dropped and it folds)."""

    header: str
    wrap: bool = False
    optional: bool = False
    justify: str = "left"
    min_width: int = 0
    prefer_width: int = 0


def fitted_table(columns: Sequence[Column], rows: Sequence[Sequence[Any]], *,
                 width: int, **table_options: Any):
    """A rich Table that fits ``width`` without cutting a cell: wrapping columns fold, and
    optional columns go when even folding cannot make room. ``table_options`` go to
    ``rich.table.Table`` (title, box...)."""
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table
    from rich.text import Text

    def preferred(i: int) -> int:
        widest = max((Text.from_markup(str(row[i])).cell_len for row in rows), default=0)
        return min(columns[i].prefer_width, widest)

    def build(keep: list[int], *, probe: bool = False) -> Table:
        table = Table(**table_options)
        for i in keep:
            c = columns[i]
            floor = max(len(c.header), c.min_width, preferred(i) if probe else 0)
            table.add_column(c.header, justify=c.justify, no_wrap=not c.wrap, overflow="fold",
                             min_width=floor)
        for row in rows:
            # The probe measures what cannot shrink: unwrapped cells and every header.
            table.add_row(*("" if probe and columns[i].wrap else row[i] for i in keep))
        return table

    keep = list(range(len(columns)))
    # Measured unconstrained: rich clamps a measurement to the width it is given.
    probe_console = Console(width=10_000)
    while True:
        needed = Measurement.get(probe_console, probe_console.options,
                                 build(keep, probe=True)).minimum
        optional = [i for i in keep if columns[i].optional]
        if needed <= width or not optional:
            return build(keep)
        keep.remove(optional[-1])


@contextmanager
def handling_errors(json_output: bool = False) -> Iterator[None]:
    """Turn the kit's errors into a message with the fix and a documented exit code."""
    try:
        yield
    except SynthDeployError as exc:
        if json_output:
            # One line: it may end an NDJSON stream (`train --stream-format json`).
            from synth_deploy.env import redact_userinfo

            hint = redact_userinfo(exc.hint) if exc.hint else exc.hint
            print_json({"ok": False, "error": {"type": type(exc).__name__,
                                               "message": redact_userinfo(exc.message),
                                               "hint": hint}}, one_line=True)
        else:
            print_error(exc.message, exc.hint)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        console(stderr=True).print("interrupted")
        raise typer.Exit(EXIT_INTERRUPTED) from None


def resolve_env(env_files: list[Path] | None, *, api_key: str | None = None):
    """The `Env` for ``--env-file`` (see `synth_deploy.env` for precedence); ``--api-key``,
    when given, is its ENVIRONMENT_API_KEY."""
    from dataclasses import replace

    from synth_deploy.env import ENVIRONMENT_API_KEY, load_env

    env = load_env(env_files or ())
    if not api_key:
        return env
    return replace(env, values={**env.values, ENVIRONMENT_API_KEY: api_key},
                   sources={**env.sources, ENVIRONMENT_API_KEY: "--api-key"})


def resolve_traces(trace_db: str | None, no_trace: bool, env):
    """The trace setting for ``--trace-db``/``--no-trace`` (None: not recorded)."""
    if no_trace:
        return None
    from synth_deploy.tracing import resolve_trace_db

    return resolve_trace_db(trace_db, env)


def traces_where(setting) -> str:
    """Where traces go, said for humans."""
    return "off (--no-trace)" if setting is None else f"{setting.display} ({setting.source})"


def cost_lines(ledger, prices) -> tuple[str, dict[str, Any] | None]:
    """A cost ledger in one line for humans, and its estimate (with a price table) for
    ``--json``: `smoke`, `eval`, `rehearse` and `traces stats` say it the same way."""
    estimate = prices.estimate(ledger) if prices is not None else None
    line = (f"cost: {ledger.input_tokens} tokens in / {ledger.output_tokens} out in "
            f"{ledger.lm_calls} LM calls · LM {ledger.lm_s:.2f}s · environment "
            f"{ledger.env_s:.2f}s"
            + (f" (sandboxes {ledger.sandbox_s:.2f}s)" if ledger.sandbox_s else "")
            + f" · wall {ledger.wall_s:.2f}s (summed over {ledger.rollouts} rollouts)")
    if ledger.cost_usd is not None:
        line += f" · recorded ${ledger.cost_usd:.4f}"
    if estimate is not None and estimate.unpriced and not any(
            prices.price_of(model) for model in ledger.by_model):
        # Nothing it used has a price: no estimate at all, never one of $0.
        line += f" · no price for {', '.join(estimate.unpriced)} in {estimate.source}"
    elif estimate is not None:
        line += f" · est. ${estimate.usd:.{4 if estimate.usd >= 0.01 else 6}f} ({estimate.source})"
        if estimate.unpriced:
            line += f", without {', '.join(estimate.unpriced)} (no price)"
    return line, estimate.to_dict() if estimate is not None else None


def plural(count: int, noun: str) -> str:
    """"1 error", "2 errors": a count with its noun (regular plurals only)."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def folded(line: str, width: int, indent: str = "  ") -> str:
    """``line``'s " · "-separated parts packed into lines of at most ``width`` columns, the
    later ones indented: a summary that fits the terminal and never splits a figure from its
    label (a part wider than the terminal stays whole)."""
    lines: list[str] = []
    for part in line.split(" · "):
        if lines and len(lines[-1]) + 3 + len(part) <= width:
            lines[-1] += " · " + part
        else:
            lines.append(part if not lines else indent + part)
    return "\n".join(lines)


def load_table(levels: Sequence[dict[str, Any]], *, width: int):
    """The capacity ramp's levels (`CapacityReport.to_dict()["levels"]`) as a table:
    `rehearse` and `check --load` show the same one."""
    from rich import box

    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    def per_second(value: float) -> str:  # a 45-s rollout is 0.022/s, not 0.0
        return f"{value:.1f}" if value >= 1 or value == 0 else f"{value:.2g}"

    rows = [[str(level["concurrency"]), str(level["rollouts"]),
             f"[red]{level['errors']}[/red]" if level["errors"] else "0",
             seconds(level["p50_s"]), seconds(level["p99_s"]), per_second(level["rollouts_per_s"]),
             "[red]gave way[/red]" if level["problem"] else "[green]held[/green]"]
            for level in levels]
    columns = [Column("concurrency", justify="right"), Column("rollouts", justify="right"),
               Column("errors", justify="right"), Column("p50 s", justify="right"),
               Column("p99 s", justify="right"), Column("rollouts/s", justify="right"),
               Column("", optional=True)]
    return fitted_table(columns, rows, width=width, box=box.SIMPLE_HEAD)


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
    "Column",
    "EnvFilesOption",
    "JsonOption",
    "NoTraceOption",
    "PricesOption",
    "TraceDbOption",
    "console",
    "cost_lines",
    "escape",
    "fitted_table",
    "folded",
    "handling_errors",
    "HeadAfterOption",
    "HeartbeatOption",
    "load_table",
    "parse_seeds",
    "plural",
    "print_error",
    "print_json",
    "resolve_env",
    "resolve_traces",
    "traces_where",
    "warn",
]
