"""`synth-deploy traces`: where traces go, and reading them back (ls, show, stats, export).

Everything printed here that came from the database or the user (paths, app and model names,
stored messages, error text) is escaped: a Llama prompt's ``[/INST]`` is text, not markup.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from synth_deploy.cli._common import (
    EXIT_FAILURE,
    EXIT_UNREACHABLE,
    EnvFilesOption,
    JsonOption,
    TraceDbOption,
    console,
    handling_errors,
    print_json,
)
from synth_deploy.errors import UsageError

traces_app = typer.Typer(help="Inspect rollout traces; export SFT data.",
                         no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(traces_app, name="traces")


def _env(env_files: list[Path] | None):
    from synth_deploy.env import load_env

    return load_env(env_files or [])


def _open(trace_db: str | None, env_files: list[Path] | None):
    # Not _common.open_traces: reads must not create a missing database.
    from synth_deploy.tracing import open_trace_store, resolve_trace_db

    env = _env(env_files)
    return open_trace_store(resolve_trace_db(trace_db, env), create=False)


def _esc(value: Any) -> str:
    from rich.markup import escape

    return escape(str(value))


def _num(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


@traces_app.command("where")
def where(trace_db: TraceDbOption = None, env_file: EnvFilesOption = None,
          json_output: JsonOption = False) -> None:
    """Say which trace database is in force, why, and whether it is reachable."""
    with handling_errors(json_output):
        from synth_deploy.tracing import describe_trace_db

        report = describe_trace_db(trace_db, _env(env_file))
    if json_output:
        print_json(report.to_dict())
    else:
        out = console()
        out.print(f"[bold]trace database[/bold]  {_esc(report.url)}", markup=True)
        out.print(f"  source             {report.source}", markup=False)
        out.print(f"  kind               {report.kind}", markup=False)
        if report.token is not None:
            out.print(f"  auth token         {report.token}", markup=False)
        state = ("not created yet" if not report.exists and report.error is None else
                 "reachable" if report.reachable or (report.ok and report.exists) else
                 "NOT reachable" if report.reachable is False else "unusable")
        out.print(f"  state              {state}", markup=False)
        if report.schema_version is not None:
            out.print(f"  schema version     {report.schema_version}", markup=False)
        for table, count in report.counts.items():
            out.print(f"  {table:<19}{count}", markup=False)
        if report.error:
            console(stderr=True).print(f"[red]error:[/red] {_esc(report.error)}", markup=True)
        if report.hint:
            console(stderr=True).print(f"  [dim]hint:[/dim] {_esc(report.hint)}", markup=True)
    if report.error:
        raise typer.Exit(EXIT_UNREACHABLE if report.reachable is False else EXIT_FAILURE)


@traces_app.command("init")
def init(trace_db: TraceDbOption = None, env_file: EnvFilesOption = None,
         json_output: JsonOption = False) -> None:
    """Create the trace database (or migrate it to the current schema)."""
    with handling_errors(json_output):
        from synth_deploy.tracing import init_trace_db

        report = init_trace_db(trace_db, _env(env_file))
    if json_output:
        print_json(report.to_dict())
    else:
        console().print(f"trace database ready: {report.url} (schema v{report.schema_version}, "
                        f"{report.counts.get('session_traces', 0)} sessions; {report.source})",
                        markup=False)


@traces_app.command("ls")
def ls(limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="Rows to show.")] = 20,
       app: Annotated[str | None, typer.Option("--app", help="Only this app id.")] = None,
       status: Annotated[str | None, typer.Option("--status", help="ok or error.")] = None,
       trace_db: TraceDbOption = None, env_file: EnvFilesOption = None,
       json_output: JsonOption = False) -> None:
    """List the newest sessions."""
    with handling_errors(json_output), _open(trace_db, env_file) as store:
        rows = store.list_sessions(limit=limit, app=app, status=status)
    if json_output:
        print_json([r.to_dict() for r in rows])
        return
    from rich.table import Table

    table = Table(title=f"{len(rows)} session(s) in {_esc(store.display)}",
                  title_justify="left")
    for column in ("session", "created (UTC)", "app", "seed", "model", "status", "reward",
                   "steps", "events", "msgs"):
        table.add_column(column, no_wrap=column in ("session", "created (UTC)"))
    for r in rows:
        table.add_row(*(_esc(cell) for cell in (
            r.session_id[:12], r.created_at[5:19], r.app_id or "-", _num(r.seed),
            r.model or "-", r.status or "-", _num(r.total_reward), r.num_timesteps,
            r.num_events, r.num_messages)))
    console().print(table)


@traces_app.command("show")
def show(session: Annotated[str, typer.Argument(help="Session id (or a unique prefix).")],
         trace_db: TraceDbOption = None, env_file: EnvFilesOption = None,
         json_output: JsonOption = False) -> None:
    """Show one session: metadata, timesteps, messages, events and rewards."""
    with handling_errors(json_output), _open(trace_db, env_file) as store:
        trace = store.get_session(session)
    if json_output:
        print_json(trace.to_dict())
        return
    out = console()
    meta = trace.metadata
    out.print(f"[bold]session {_esc(trace.session_id)}[/bold]", markup=True)
    for key in ("app_id", "run_id", "seed", "model", "status", "duration_s"):
        out.print(f"  {key:<12}{_num(meta.get(key), 6)}", markup=False)
    if meta.get("error"):
        out.print(f"  error       {meta['error'].get('message')}", markup=False)
    for step in trace.timesteps:
        out.print(f"[bold]· {_esc(step.step_id)}[/bold] (turn {_num(step.turn_number)})",
                  markup=True)
        for m in step.messages:
            text = m.content if isinstance(m.content, str) else str(m.content)
            out.print(f"    [cyan]{_esc(f'{m.message_type:>9}')}[/cyan] {_esc(text[:300])}",
                      markup=True, highlight=False)
        for e in step.events:
            if e.event_type == "cais":
                out.print(f"    [dim]lm call {_esc(e.model_name)} in={_num(e.input_tokens)} "
                          f"out={_num(e.output_tokens)} {_num(e.latency_ms, 4)}ms[/dim]",
                          markup=True)
            else:
                out.print(f"    [dim]{_esc(e.event_type)} reward={_num(e.reward)} "
                          f"terminated={e.terminated}[/dim]", markup=True)
    for r in trace.event_rewards:
        out.print(f"  event reward {r.reward_type}={_num(r.reward_value)} ({r.source}, "
                  f"turn {_num(r.turn_number)})", markup=False)
    for o in trace.outcome_rewards:
        out.print(f"  [bold]outcome reward {_num(o.total_reward)}[/bold]", markup=True)


@traces_app.command("stats")
def stats(trace_db: TraceDbOption = None, env_file: EnvFilesOption = None,
          json_output: JsonOption = False) -> None:
    """Totals: sessions, errors, LM calls, tokens and cost, per app and model."""
    with handling_errors(json_output), _open(trace_db, env_file) as store:
        result = store.stats()
    if json_output:
        print_json(result.to_dict())
        return
    out = console()
    out.print(f"[bold]{_esc(store.display)}[/bold]", markup=True)
    out.print(f"  sessions {result.sessions} (ok {result.ok}, errors {result.errors}) from "
              f"{result.first_at or '-'} to {result.last_at or '-'}", markup=False)
    out.print(f"  lm calls {result.lm_calls}, tokens in {result.input_tokens} / out "
              f"{result.output_tokens}, cost ${result.cost_usd:.4f}", markup=False)
    for row in result.by_app:
        out.print(f"  app {row['app_id'] or '-'}: {row['sessions']} sessions, "
                  f"{row['errors'] or 0} errors, mean reward {_num(row['mean_reward'])}",
                  markup=False)
    for row in result.by_model:
        out.print(f"  model {row['model'] or '-'}: {row['lm_calls']} calls, mean latency "
                  f"{_num(row['mean_latency_ms'], 4)} ms", markup=False)


@traces_app.command("export")
def export(
    out: Annotated[Path, typer.Option("--out", "-o", help="JSONL file to write.")],
    fmt: Annotated[str, typer.Option("--format", help="Only 'sft' for now.")] = "sft",
    min_reward: Annotated[float | None, typer.Option(
        "--min-reward", help="Keep sessions with outcome reward ≥ this.")] = None,
    app: Annotated[str | None, typer.Option("--app", help="Only this app id.")] = None,
    model: Annotated[str | None, typer.Option("--model", help="Only this policy model.")] = None,
    since: Annotated[str | None, typer.Option(
        "--since", help="Only newer sessions: 24h, 7d, or an ISO date/time (UTC).")] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Max examples.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace --out if it exists.")] = False,
    trace_db: TraceDbOption = None, env_file: EnvFilesOption = None,
    json_output: JsonOption = False,
) -> None:
    """Write SFT JSONL (one chat example per policy call) from stored rollouts."""
    with handling_errors(json_output):
        if fmt != "sft":
            raise UsageError(f"unknown --format {fmt!r}", hint="supported: sft")
        with _open(trace_db, env_file) as store:
            from synth_deploy.tracing import export_sft

            result = export_sft(store, out, min_reward=min_reward, app=app, model=model,
                                since=since, limit=limit, overwrite=force)
    if json_output:
        print_json(result.to_dict())
    else:
        console().print(f"wrote {result.examples} example(s) from {result.sessions} session(s) "
                        f"to {result.path} in {result.seconds:.2f}s", markup=False)
