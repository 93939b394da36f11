"""`synth-deploy rehearse`: one training step, determinism, capacity, timeouts and idle
connections, checked against the task app before a run rents GPUs.

Exit codes: 0 ready to train (warnings allowed) · 1 a problem that would waste the run ·
2 usage (bad flag or config) · 3 unreachable. ``--json`` prints ``RehearsalReport.to_dict()``
(its shape is in ``synth_deploy/runs/_rehearsal_report.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from synth_deploy.cli._common import (
    Column,
    EnvFilesOption,
    JsonOption,
    NoTraceOption,
    PricesOption,
    TraceDbOption,
    console,
    cost_lines,
    escape,
    fitted_table,
    handling_errors,
    load_table,
    plural,
    print_json,
    resolve_env,
    resolve_traces,
    traces_where,
)
from synth_deploy.errors import UsageError

HELP = """Rehearse a training run against the task app, before paying for it.

Runs one training step as the trainer would (episodes_per_batch rollouts in groups of
group_size, same seed within a group, at max_concurrent_rollouts), then checks that a seed
gives the same task twice, ramps concurrency until the app gives way, orders the timeouts a
rollout passes through, and sends a rollout on a connection left idle. The task app: --app
(served here with an ephemeral key), else --task-url, TASK_APP_URL, [services].task_url.

Exit codes: 0 ready to train · 1 a problem that would waste the run · 2 bad flags or config ·
3 task app unreachable.
"""

_STYLES = {"pass": ("✓ pass", "green"), "fail": ("✗ fail", "red"),
           "warn": ("! warn", "yellow"), "skip": ("- skip", "dim")}
_GROUPS_SHOWN = 12


def register(app: typer.Typer) -> None:
    app.command("rehearse", help=HELP)(rehearse_command)


def rehearse_command(
    config: Annotated[Path, typer.Option("--config", help="The RL config (TOML) to rehearse.",
                                         show_default=False)],
    task_url: Annotated[str | None, typer.Option(
        "--task-url", help="The task app's URL (default: TASK_APP_URL, then "
                           "[services].task_url).", show_default=False)] = None,
    app_ref: Annotated[str | None, typer.Option(
        "--app", help="An app id or file to serve here for the rehearsal, instead of a URL.",
        show_default=False)] = None,
    inference_url: Annotated[str | None, typer.Option(
        "--inference-url", help="OpenAI-compatible base URL of a real policy (default: the "
                                "built-in mock).", show_default=False)] = None,
    model: Annotated[str | None, typer.Option("--model", help="Model name sent to the policy.",
                                              show_default=False)] = None,
    max_time: Annotated[float | None, typer.Option(
        "--max-time", min=0.1, metavar="SECONDS", help="The rollout budget (safety.max_time_s) "
        "to send (default: the app's limits.timeout_seconds, else 300).",
        show_default=False)] = None,
    trainer_timeout: Annotated[float | None, typer.Option(
        "--trainer-timeout", min=0.1, metavar="SECONDS",
        help="The trainer's per-rollout timeout, checked against the others.",
        show_default=False)] = None,
    max_concurrency: Annotated[int | None, typer.Option(
        "--max-concurrency", min=1, max=1024, help="The capacity ramp's last level (default: "
        "twice max_concurrent_rollouts, at least 8).", show_default=False)] = None,
    idle: Annotated[float | None, typer.Option(
        "--idle", min=0.1, metavar="SECONDS", help="How long to hold a keep-alive connection "
        "idle (default: 6 on loopback, 80 remote).", show_default=False)] = None,
    skip: Annotated[list[str] | None, typer.Option(
        "--skip", help="A check not to run: determinism, capacity or idle (repeatable).",
        show_default=False)] = None,
    env_file: EnvFilesOption = None,
    trace_db: TraceDbOption = None,
    no_trace: NoTraceOption = False,
    prices: PricesOption = None,
    json_output: JsonOption = False,
) -> None:
    with handling_errors(json_output):
        from synth_deploy.runs import RehearsalOptions, policy_target, rehearse
        from synth_deploy.train import load_config

        loaded = load_config(config)
        env = resolve_env(env_file)
        price_table = _prices(prices, env)
        target = _target(app_ref, task_url, loaded, env)
        options = RehearsalOptions(budget_s=max_time, trainer_timeout_s=trainer_timeout,
                                   max_concurrency=max_concurrency, idle_s=idle,
                                   skip=frozenset(skip or ()))
        traces = resolve_traces(trace_db, no_trace, env)
        with _live(enabled=not json_output) as on_progress:
            report = rehearse(loaded, target, env, options,
                              policy=policy_target(inference_url, model, env), traces=traces,
                              on_progress=on_progress)
        report.traces = traces_where(traces)
    ledger = _ledger(report)
    if json_output:
        print_json({**report.to_dict(), "cost_estimate":
                    cost_lines(ledger, price_table)[1] if ledger is not None else None})
    else:
        _render(report, loaded.warnings, price_table)
    raise typer.Exit(report.exit_code)


def _prices(flag: Path | None, env: Any) -> Any:
    from synth_deploy.tracing import resolve_price_table

    return resolve_price_table(flag, env)


def _ledger(report: Any) -> Any:
    """The training step's cost ledger (tokens, LM/environment/wall time), if it ran."""
    from synth_deploy.tracing import CostLedger

    step = report.check("training step")
    return CostLedger.from_dict(step.data.get("ledger")) if step is not None else None


def _target(app_ref: str | None, task_url: str | None, loaded: Any, env: Any) -> str:
    """--app, else the URL: --task-url > TASK_APP_URL > [services].task_url."""
    from synth_deploy.env import TASK_APP_URL
    from synth_deploy.urls import http_url

    if app_ref and task_url:
        raise UsageError("pass either --app (serve it here) or --task-url, not both")
    if app_ref:
        return app_ref
    for value, where in ((task_url, "--task-url"), (env.get(TASK_APP_URL), TASK_APP_URL),
                         (loaded.task_url, f"{loaded.path.name}: [services].task_url")):
        if value:
            return http_url(value, what=where)
    raise UsageError("no task app to rehearse against",
                     hint="pass --app APP (served here) or --task-url URL, or set "
                          f"{TASK_APP_URL} or [services].task_url")


class _live:
    """Progress lines on stderr while the rehearsal runs, as `check --load` prints them: one
    when a stage starts, then its count every few seconds and when it ends (a plain line
    reaches a log or a pipe, where a live bar shows nothing); yields its callback."""

    EVERY_S = 5.0

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __enter__(self):
        if not self.enabled:
            return None
        import time

        err = console(stderr=True)
        started = time.monotonic()
        state = {"stage": None, "said": 0.0}

        def on_progress(event) -> None:
            now = time.monotonic()
            total = f" of {event.total}" if event.total else ""
            errors = f", [red]{plural(event.errors, 'error')}[/red]" if event.errors else ""
            if event.stage != state["stage"]:
                state["stage"], state["said"] = event.stage, now
                err.print(f"[dim]rehearse: {escape(event.stage)}"
                          f"{f', {event.total} to run' if event.total else ''}… "
                          f"({now - started:.0f} s)[/dim]", highlight=False)
            elif now - state["said"] >= self.EVERY_S or (event.total and
                                                          event.done >= event.total):
                state["said"] = now
                err.print(f"[dim]rehearse: {escape(event.stage)} {event.done}{total} done"
                          f"[/dim]{errors}[dim] ({now - started:.0f} s)[/dim]",
                          highlight=False)

        return on_progress

    def __exit__(self, *exc: object) -> None:
        pass


def _render(report: Any, warnings: list[str], prices: Any = None) -> None:
    from rich import box
    from rich.text import Text

    out = console()
    for note in [*warnings, *report.notes]:
        out.print(Text(note, style="dim"))
    width = min(out.width, 100)
    rows = []
    for check in report.checks:
        label, style = _STYLES[check.verdict]
        rows.append([check.name, f"[{style}]{label}[/{style}]", escape(check.finding)])
    out.print(fitted_table([Column("check"), Column("verdict"),
                            Column("finding", wrap=True, min_width=24)], rows, width=width,
                           box=box.SIMPLE_HEAD, title=f"rehearsal of {report.target}",
                           title_justify="left"))
    _render_groups(out, report, width)
    capacity = report.check("capacity")
    if capacity is not None and capacity.data.get("levels"):
        out.print(load_table(capacity.data["levels"], width=width))
    _render_timeouts(out, report, width)
    for check in report.checks:
        _render_check_lines(out, check)
    if (ledger := _ledger(report)) is not None:
        out.print(Text(cost_lines(ledger, prices)[0], style="dim"))
    out.print(Text(f"traces → {report.traces}", style="dim"))
    failed = [c.name for c in report.checks if c.verdict == "fail"]
    verdict = (Text("ready to train", style="bold green") if report.ready else
               Text(f"not ready: {', '.join(failed)}", style="bold red"))
    verdict.append(f" ({report.elapsed_s:.1f} s, exit {report.exit_code})", style="dim")
    out.print(verdict)


def _render_timeouts(out: Any, report: Any, width: int) -> None:
    """The timeout layers, inside first, each with its limit and who set it."""
    from rich import box

    timeouts = report.check("timeouts")
    if timeouts is None or not timeouts.data.get("layers"):
        return
    rows = [[layer["name"], f"{layer['seconds']:g}s", escape(layer["source"])]
            for layer in timeouts.data["layers"]]
    out.print(fitted_table([Column("timeout (inside first)"), Column("limit",
                            justify="right"), Column("set by", wrap=True)], rows,
                           width=width, box=box.SIMPLE_HEAD))


def _render_check_lines(out: Any, check: Any) -> None:
    """A check's details, then its fix when it failed or warned; wrapped at word
    boundaries, never cut: a cause or a fix is read whole."""
    from rich.text import Text

    if check.verdict not in ("fail", "warn") and not check.details:
        return
    label, style = _STYLES[check.verdict]
    for line in check.details:
        out.print(Text(f"  {check.name}: {line}", style="dim"))
    if check.fix and check.verdict in ("fail", "warn"):
        fix = Text(f"{label.split()[0]} {check.name}: ", style=style)
        fix.append(check.fix)
        out.print(fix)


def _group_row(group: dict[str, Any]) -> list[str]:
    """A group's row: its rewards (and failures), their variance, a flag when it is zero."""
    rewards = " ".join(f"{r:g}" for r in group["rewards"]) or "-"
    if group["failures"]:
        rewards += f" ({group['failures']} failed)"
    variance = "-" if group["variance"] is None else f"{group['variance']:.3f}"
    flag = "[yellow]zero[/yellow]" if group["zero_variance"] else ""
    return [str(group["group"]), str(group["seed"]), rewards, variance, flag]


def _render_groups(out: Any, report: Any, width: int) -> None:
    from rich import box

    signal = report.check("reward signal")
    groups = (signal.data.get("groups") if signal is not None else None) or []
    if not groups:
        return
    rows = [_group_row(group) for group in groups[:_GROUPS_SHOWN]]
    out.print(fitted_table([Column("group", justify="right"), Column("seed", justify="right"),
                            Column("rewards", wrap=True), Column("variance", justify="right"),
                            Column("signal", optional=True)], rows, width=width,
                           box=box.SIMPLE_HEAD))
    if len(groups) > _GROUPS_SHOWN:
        out.print(f"[dim]… {len(groups) - _GROUPS_SHOWN} more groups (--json shows all)[/dim]")


__all__ = ["register", "rehearse_command"]
