"""`synth-deploy traces`: where traces go, and reading them back (ls, show, stats, export).

Everything printed here that came from the database or the user (paths, app and model names,
stored messages, error text) is escaped: a Llama prompt's ``[/INST]`` is text, not markup.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from synth_deploy.cli._common import (
    EXIT_FAILURE,
    EXIT_UNREACHABLE,
    Column,
    EnvFilesOption,
    JsonOption,
    PricesOption,
    TraceDbOption,
    console,
    cost_lines,
    fitted_table,
    folded,
    handling_errors,
    plural,
    print_error,
    print_json,
    warn,
)
from synth_deploy.errors import UsageError

traces_app = typer.Typer(help="Inspect rollout traces; export SFT data.",
                         no_args_is_help=True)
# The one model rule of every filter (synth_deploy.tracing.SessionFilter).
REWARD_VERSION_HELP = ("The reward each session is judged by: a version `traces rescore` "
                       "wrote (only the sessions it scored), or original (the recorded one, "
                       "the default).")
MODEL_HELP = ("Only sessions whose policy used this model (the session's model, as `traces ls` "
              "shows it; other models its LM calls used, a judge's say, do not count).")


def register(app: typer.Typer) -> None:
    app.add_typer(traces_app, name="traces")


def _env(env_files: list[Path] | None):
    from synth_deploy.env import load_env

    return load_env(env_files or [])


def _open(trace_db: str | None, env_files: list[Path] | None):
    # Not _common.open_traces: reads never create, migrate or otherwise change the database
    # (synth-ai may keep writing to it); `traces init` migrates on purpose.
    from synth_deploy.tracing import open_trace_store, resolve_trace_db

    env = _env(env_files)
    return open_trace_store(resolve_trace_db(trace_db, env), read_only=True)


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
        _print_where(report)
    if report.error:
        raise typer.Exit(EXIT_UNREACHABLE if report.reachable is False else EXIT_FAILURE)


def _where_state(report: Any) -> str:
    """The database's state in one word or three, as `traces where` says it."""
    if not report.exists and report.error is None:
        return "not created yet"
    if report.reachable or (report.ok and report.exists):
        return "reachable"
    return "NOT reachable" if report.reachable is False else "unusable"


def _print_where(report: Any) -> None:
    """`traces where` for humans: the URL, why it is in force, its state and tables."""
    out = console()
    out.print(f"[bold]trace database[/bold]  {_esc(report.url)}", markup=True)
    out.print(f"  source             {report.source}", markup=False)
    out.print(f"  kind               {report.kind}", markup=False)
    if report.token is not None:
        out.print(f"  auth token         {report.token}", markup=False)
    out.print(f"  state              {_where_state(report)}", markup=False)
    if report.schema_version is not None:
        out.print(f"  schema version     {report.schema_version}", markup=False)
    for table, count in report.counts.items():
        out.print(f"  {table:<19}{count}", markup=False)
    if report.error:
        print_error(report.error, report.hint)
    elif report.hint:
        console(stderr=True).print(f"  [dim]hint:[/dim] {_esc(report.hint)}", markup=True)


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
       model: Annotated[str | None, typer.Option("--model", help=MODEL_HELP)] = None,
       app_digest: Annotated[str | None, typer.Option(
           "--app-digest", help="Only sessions made by this code of their app (its digest, or "
                                "its first digits, as the code column shows it).")] = None,
       group: Annotated[str | None, typer.Option(
           "--group", help="identity: one row per app and code version (the sessions each "
                           "made, errors, mean reward, first and last) instead of "
                           "sessions.")] = None,
       trace_db: TraceDbOption = None, env_file: EnvFilesOption = None,
       json_output: JsonOption = False) -> None:
    """List the newest sessions (or, with --group identity, which code made them)."""
    with handling_errors(json_output):
        if group not in (None, "identity"):
            raise UsageError(f"cannot group by {group!r}", hint="use --group identity")
        filters = {"app": app, "status": status, "model": model, "app_digest": app_digest}
        with _open(trace_db, env_file) as store:
            if group == "identity":
                from synth_deploy.tracing import SessionFilter, identity_groups

                groups = identity_groups(store, SessionFilter(**filters), limit=limit)
            else:
                rows, stored = _newest_sessions(store, limit, filters)
    if group == "identity":
        _print_identity_groups(groups, store.display, json_output)
        return
    if json_output:
        print_json([r.to_dict() for r in rows])
        return
    _print_sessions(rows, stored, store.display)


def _newest_sessions(store: Any, limit: int, filters: dict[str, Any]) -> tuple[list[Any], int]:
    """The newest ``limit`` sessions and how many match: counted only when the limit may hide
    some (then the title says how many)."""
    rows = store.list_sessions(limit=limit, **filters)
    stored = store.count_sessions(**filters) if len(rows) == limit else len(rows)
    return rows, stored


def _shared_values(rows: list[Any]) -> dict[str, Any]:
    """An app, code or model every row shares, said once above the table: a column of the
    same value over and over would take the room the others need to stay whole."""
    shared = {}
    for name, values in (("app", {r.app_id for r in rows}),
                         ("code", {_code(r.app_version, r.app_digest) for r in rows}),
                         ("model", {r.model for r in rows})):
        if len(values) == 1 and None not in values:
            shared[name] = values.pop()
    return shared


def _print_sessions(rows: list[Any], stored: int, display: str) -> None:
    """`traces ls` for humans: a title, what every row shares, then a table that fits."""
    from rich import box

    title = (f"newest {len(rows)} of {stored} sessions in {_esc(display)} (--limit N "
             "shows more)" if stored > len(rows)
             else f"{len(rows)} session(s) in {_esc(display)}")
    shared = _shared_values(rows)
    # Sessions stored before apps said which code they ran (or by another writer): no column.
    unknown = {"code"} if all(r.app_digest is None and r.app_version is None
                              for r in rows) else set()
    columns = _session_columns({*shared, *unknown})
    cells = [[_esc(cell[name]) for name in columns] for cell in map(_session_cells, rows)]
    out = console()
    out.print(title, markup=True)
    if shared:
        out.print(folded("every one shown: " + " · ".join(
            f"{name} {value}" for name, value in shared.items()), out.width), markup=False,
            soft_wrap=True)
    out.print(fitted_table(list(columns.values()), cells, width=out.width,
                           box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                           padding=(0, 1, 0, 0)))


def _session_columns(hidden: set[str]) -> dict[str, Column]:
    """`traces ls`'s columns by name, but those said above the table or never known."""
    # 16 characters: ids are time-ordered (11 are the millisecond), the other 5 tell apart
    # the sessions a busy millisecond holds, so `traces show` takes what is printed. Neither
    # it nor the time is ever cut: at 60 columns the time goes rather than lose its seconds.
    columns = {"session": Column("session", min_width=16),
               "created (UTC)": Column("created (UTC)", optional=True, min_width=14),
               "app": Column("app", wrap=True, prefer_width=12),
               "code": Column("code", min_width=8),
               "seed": Column("seed", justify="right"),
               "model": Column("model", wrap=True, min_width=8, prefer_width=20),
               "status": Column("status"),
               "reward": Column("reward", justify="right"),
               "steps": Column("steps", justify="right", optional=True),
               "events": Column("events", justify="right", optional=True),
               "msgs": Column("msgs", justify="right", optional=True)}
    for name in hidden:
        del columns[name]
    return columns


def _session_cells(r: Any) -> dict[str, Any]:
    """One session's `traces ls` cells by column name, before escaping."""
    return {"session": r.session_id[:16], "created (UTC)": r.created_at[5:19].replace("T", " "),
            "app": r.app_id or "-", "code": _code(r.app_version, r.app_digest) or "-",
            "seed": _num(r.seed), "model": r.model or "-",
            "status": r.status or "-", "reward": _num(r.total_reward),
            "steps": r.num_timesteps, "events": r.num_events, "msgs": r.num_messages}


def _code(version: str | None, digest: str | None) -> str | None:
    """Which code of its app made a session, as the tables show it: ``v1 3f2a9c1d``."""
    if digest is None and version is None:
        return None
    return " ".join(p for p in (version and f"v{version}", digest and digest[:8]) if p)


def _print_identity_groups(groups: list[Any], display: str, json_output: bool) -> None:
    if json_output:
        print_json([g.to_dict() for g in groups])
        return
    from rich import box

    columns = [Column("app", wrap=True, prefer_width=12), Column("version"),
               Column("digest", min_width=16), Column("sessions", justify="right"),
               Column("errors", justify="right"), Column("mean reward", justify="right"),
               Column("first (UTC)", optional=True, min_width=14),
               Column("last (UTC)", min_width=14)]
    cells = [[_esc(v) for v in (g.app_id or "-", g.app_version or "-",
                                g.app_digest or "(not recorded)", g.sessions, g.errors,
                                _num(g.mean_reward), (g.first_at or "-")[5:19],
                                (g.last_at or "-")[5:19])] for g in groups]
    out = console()
    out.print(f"{plural(len(groups), 'app code version')} in {_esc(display)} "
              "(`traces ls --app-digest D` lists one's sessions)", markup=True)
    out.print(fitted_table(columns, cells, width=out.width, box=box.SIMPLE_HEAD,
                           show_edge=False, pad_edge=False, padding=(0, 1, 0, 0)))


@traces_app.command("show")
def show(session: Annotated[str, typer.Argument(metavar="SESSION",
                                                help="Session id (or a unique prefix).")],
         reward_version: Annotated[str | None, typer.Option(
             "--reward-version", help="The reward to show as the session's: a version "
                                      "`traces rescore` wrote, or original.")] = None,
         trace_db: TraceDbOption = None, env_file: EnvFilesOption = None,
         json_output: JsonOption = False) -> None:
    """Show one session: metadata, timesteps, messages, events and rewards (each reward
    version beside the recorded one)."""
    with handling_errors(json_output), _open(trace_db, env_file) as store:
        from synth_deploy.tracing import reward_versions_of, session_reward

        trace = store.get_session(session)
        versions = reward_versions_of(store, trace.session_id)
        chosen = _chosen_reward(versions, reward_version, session_reward(trace))
    from synth_deploy.tracing import summarize

    turns = trace.turn_tokens
    tokens = summarize(turns) if turns else None
    if json_output:
        print_json({**trace.to_dict(), "token_summary": tokens and tokens.to_dict(),
                    "reward": chosen, "reward_versions": versions})
        return
    out = console()
    _print_session_head(out, trace, tokens)
    from synth_deploy.tracing import replay

    for played in replay(trace):
        _print_step(out, played)
    _print_rewards(out, trace, versions, chosen)


def _print_session_head(out: Any, trace: Any, tokens: Any) -> None:
    """`traces show`'s first lines: the session's metadata, its error and its tokens."""
    meta = trace.metadata
    out.print(f"[bold]session {_esc(trace.session_id)}[/bold]", markup=True)
    shown = {**meta, "app_id": meta.get("app_id") or meta.get("env_name")}  # synth-ai: env
    shown["code"] = _code(meta.get("app_version"), meta.get("app_digest"))
    for key in ("app_id", "code", "run_id", "seed", "model", "status", "duration_s"):
        out.print(f"  {key:<12}{_num(shown.get(key), 6)}", markup=False)
    if meta.get("error"):
        out.print(f"  error       {meta['error'].get('message')}", markup=False)
    if tokens is not None:
        out.print(f"  tokens      {tokens.describe()}", markup=False)
        for broke in tokens.breaks:
            out.print(f"  [yellow]! {_esc(broke.describe())}[/yellow]", markup=True)
        for reason in tokens.absent:
            out.print(f"  [yellow]! no token data: {_esc(reason)}[/yellow]", markup=True)


def _print_step(out: Any, played: Any) -> None:
    """One timestep as replayed: its new messages (long ones cut), then its events."""
    from synth_deploy.tracing import message_text

    step = played.step
    out.print(f"[bold]· {_esc(step.step_id)}[/bold] (turn {_num(step.turn_number)})"
              + (f" [dim]({played.repeated} earlier messages not repeated)[/dim]"
                 if played.repeated else ""), markup=True)
    for m in played.messages:
        text = message_text(m)
        text = text if len(text) <= 2000 else text[:2000] + " …"
        out.print(f"    [cyan]{_esc(f'{m.message_type:>9}')}[/cyan] {_esc(text)}",
                  markup=True, highlight=False)
    for e in step.events:
        _print_event(out, e)


def _print_event(out: Any, e: Any) -> None:
    """One event's dim line: an LM call, a sandbox run (with its output) or an env step."""
    if e.event_type == "cais":
        ids = "" if e.tokens is None else (
            f" ids={len(e.tokens.prompt_ids)}+{len(e.tokens.completion_ids)}"
            if e.tokens.observed else " ids=none")
        out.print(f"    [dim]lm call {_esc(e.model_name)} in={_num(e.input_tokens)} "
                  f"out={_num(e.output_tokens)}{ids} {_num(e.latency_ms, 4)}ms[/dim]",
                  markup=True)
    elif (line := _sandbox_line(e)) is not None:
        out.print(f"    [dim]{_esc(line)}[/dim]", markup=True)
        _print_sandbox_output(out, e.metadata["sandbox"])
    else:
        actions = e.metadata.get("actions")
        out.print(f"    [dim]{_esc(e.event_type)} reward={_num(e.reward)} "
                  f"terminated={e.terminated}"
                  + (f" actions={_esc(','.join(map(str, actions)))}"
                     if isinstance(actions, list) else "") + "[/dim]", markup=True)


def _print_sandbox_output(out: Any, record: dict[str, Any]) -> None:
    """A sandbox run's stdout and stderr, each cut at 400 characters."""
    for stream in ("stdout", "stderr"):
        text = str(record.get(stream) or "").strip()
        if text:
            shown = text if len(text) <= 400 else text[:400] + " …"
            out.print(f"      [dim]{stream}: {_esc(shown)}[/dim]", markup=True)


def _print_rewards(out: Any, trace: Any, versions: list[dict[str, Any]],
                   chosen: dict[str, Any]) -> None:
    """`traces show`'s last lines: event and outcome rewards, each version, the one shown."""
    for r in trace.event_rewards:
        out.print(f"  event reward {r.reward_type}={_num(r.reward_value)} ({r.source}, "
                  f"turn {_num(r.turn_number)})", markup=False)
    for o in trace.outcome_rewards:
        out.print(f"  [bold]outcome reward {_num(o.total_reward)}[/bold]", markup=True)
    for v in versions:
        mark = "[bold]" if v["version"] == chosen["version"] else ""
        out.print(f"  {mark}reward {_num(v['reward'])} (version {_esc(v['version'])}, "
                  f"{_esc(v['scorer'].get('function'))} of code "
                  f"{_esc(_code(v['scorer'].get('app_version'), v['scorer'].get('app_digest')))}"
                  f", {_esc(v['created_at'][:19])}){mark and '[/bold]'}", markup=True)
    out.print(f"  reward shown: {_num(chosen['reward'])} ({_esc(chosen['version'])})",
              markup=True)


def _chosen_reward(versions: list[dict[str, Any]], wanted: str | None,
                   recorded: float | None) -> dict[str, Any]:
    """The reward `traces show` calls the session's: ``wanted``'s, else the recorded one."""
    from synth_deploy.tracing import ORIGINAL_REWARD, SessionFilter

    version = SessionFilter(reward_version=wanted).reward_version  # checked, "original": None
    if version is None:
        return {"version": ORIGINAL_REWARD, "reward": recorded}
    for v in versions:
        if v["version"] == version:
            return {"version": version, "reward": v["reward"]}
    have = ", ".join(v["version"] for v in versions) or "none"
    raise UsageError(f"this session has no reward version {version!r} (it has: {have})",
                     hint="leave --reward-version out for the recorded reward")


@traces_app.command("rescore")
def rescore(
    app_ref: Annotated[str, typer.Argument(
        metavar="APP", help="App id or task app file: its scorer, as its code is now.")],
    app: Annotated[str | None, typer.Option(
        "--app", help="Only sessions of this app id (default: APP's own).")] = None,
    model: Annotated[str | None, typer.Option("--model", help=MODEL_HELP)] = None,
    run_id: Annotated[str | None, typer.Option("--run", help="Only this run id.")] = None,
    since: Annotated[str | None, typer.Option(
        "--since", help="Only newer sessions: 24h, 7d, or an ISO date/time (UTC).")] = None,
    app_digest: Annotated[str | None, typer.Option(
        "--app-digest", help="Only sessions made by this code of the app.")] = None,
    version: Annotated[str | None, typer.Option(
        "--as", help="The version's label (default: the app's code digest; the same label "
                     "again replaces that version).")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Rescore with a scorer the app declares stateful (it needs what the "
                        "trace does not keep).")] = False,
    trace_db: TraceDbOption = None, env_file: EnvFilesOption = None,
    json_output: JsonOption = False,
) -> None:
    """Score stored sessions again with the app's current scorer: each result a new reward
    version beside the recorded one (never over it); says what changed."""
    with handling_errors(json_output):
        from synth_deploy.runs import rescore_app
        from synth_deploy.taskapp.registry import load_app
        from synth_deploy.tracing import (
            SessionFilter,
            open_trace_store,
            resolve_trace_db,
            since_timestamp,
        )

        where = SessionFilter(app=app, model=model, run_id=run_id, app_digest=app_digest,
                              since=since_timestamp(since) if since else None)
        config = load_app(app_ref).build_config()
        # Writes: opened as the writers open it (a store from before versions is migrated),
        # never created: a rescore of a store that is not there is a mistake to name.
        with open_trace_store(resolve_trace_db(trace_db, _env(env_file)),
                              create=False) as store, \
                _export_progress(json_output, "rescoring sessions") as progress:
            result = rescore_app(config, store, where, version=version, force=force,
                                 progress=progress)
    if json_output:
        print_json(result.to_dict())
        return
    out = console()
    scorer = result.scorer
    out.print(f"rescored {result.rescored} of {plural(result.matched, 'session')} of "
              f"{_esc(scorer['app_id'])} as reward version [bold]{_esc(result.version)}"
              f"[/bold] ({_esc(scorer['function'])}, code "
              f"{_esc(_code(scorer.get('app_version'), scorer.get('app_digest')))}) in "
              f"{result.seconds:.2f}s", markup=True, soft_wrap=True)
    out.print(f"  mean reward {_num(result.mean_before)} recorded -> {_num(result.mean_after)} "
              f"rescored; {result.changed} changed, {result.unchanged} the "
              "same" + (f"; {result.replaced} replaced this version's earlier reward"
                        if result.replaced else ""), markup=False, soft_wrap=True)
    if result.failed_left_out:
        out.print(f"  {plural(result.failed_left_out, 'failed rollout')} left out (their "
                  "episodes did not finish)", markup=False)
    if result.unscored_count:
        warn(f"{plural(result.unscored_count, 'session')} could not be rescored (" + ", ".join(
            f"{n} {reason}" for reason, n in result.unscored_reasons.items()) + "):")
        for u in result.unscored[:10]:
            out.print(f"    {_esc(u.session_id[:16])}  {_esc(u.reason)}", markup=True)
    out.print(f"  export with it: synth-deploy traces export --reward-version "
              f"{_esc(result.version)} --min-reward R --out sft.jsonl", markup=True,
              soft_wrap=True)
    if result.matched and not result.rescored:
        raise typer.Exit(EXIT_FAILURE)


def _sandbox_line(event) -> str | None:
    if event.system_instance_id != "sandbox" or not isinstance(event.metadata, dict):
        return None
    from synth_deploy.sandbox import event_summary

    return event_summary(event.metadata.get("sandbox"))


@traces_app.command("stats")
def stats(trace_db: TraceDbOption = None, env_file: EnvFilesOption = None,
          prices: PricesOption = None, json_output: JsonOption = False) -> None:
    """Totals: sessions, errors, LM calls, tokens, time and cost, per app and model."""
    with handling_errors(json_output):
        from synth_deploy.tracing import resolve_price_table

        table = resolve_price_table(prices, _env(env_file))
        with _open(trace_db, env_file) as store:
            result = store.stats()
    cost_line, estimate = cost_lines(result.ledger, table)
    # What the LM calls recorded, None when none did: an unpriced model is never $0.
    recorded = result.ledger.cost_usd
    if json_output:
        print_json({**result.to_dict(), "cost_usd": recorded, "cost_estimate": estimate})
        return
    out = console()
    out.print(f"[bold]{_esc(store.display)}[/bold]", markup=True)
    out.print(f"  sessions {result.sessions} (ok {result.ok}, errors {result.errors}) from "
              f"{result.first_at or '-'} to {result.last_at or '-'}", markup=False)
    # The cost, recorded or estimated, is on the cost line.
    out.print(f"  lm calls {result.lm_calls}, tokens in {result.input_tokens} / out "
              f"{result.output_tokens}", markup=False)
    out.print(folded(f"  {cost_line}", out.width, "    "), markup=False, soft_wrap=True)
    for row in result.by_app:
        out.print(f"  app {row['app_id'] or '-'}: {plural(row['sessions'], 'session')}, "
                  f"{plural(row['errors'] or 0, 'error')}, mean reward "
                  f"{_num(row['mean_reward'])}", markup=False)
    for row in result.by_model:
        out.print(f"  model {row['model'] or '-'}: {plural(row['lm_calls'], 'call')}, mean latency "
                  f"{_num(row['mean_latency_ms'], 4)} ms", markup=False)


@contextmanager
def _export_progress(json_output: bool, label: str = "exporting sessions"
                     ) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on a terminal's stderr; nothing when it is piped or for --json."""
    err = console(stderr=True)
    if json_output or not err.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.elapsed:.0f}s"), console=err, transient=True) as bar:
        task = bar.add_task("export", total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


@traces_app.command("pull")
def pull(
    app_ref: Annotated[str, typer.Argument(
        metavar="APP", help="App id or task app file (its Modal app and trace Volume, as "
                            "deployed), or a Modal app name.")],
    volume: Annotated[str | None, typer.Option(
        "--volume", help="The trace Volume (default: the app's, as deployed; for a Modal "
                         "app name, APP-traces).")] = None,
    trace_db: TraceDbOption = None, env_file: EnvFilesOption = None,
    json_output: JsonOption = False,
    modal_cli: Annotated[str | None, typer.Option("--modal-cli", hidden=True)] = None,
) -> None:
    """Fetch a deployed app's traces from its Modal Volume into the local store.

    Downloads only what changed since the last pull; a session already stored is never
    added twice. Then `traces ls/stats/export/view` read them as local traces. A file that
    cannot be read is named, the rest merged, and the exit code is 1; the next pull tries it
    again.
    """
    with handling_errors(json_output):
        import shlex

        from synth_deploy.modal import ModalCLI, pull_traces
        from synth_deploy.tracing import open_trace_store, resolve_trace_db

        env = _env(env_file)
        cli = ModalCLI(shlex.split(modal_cli)) if modal_cli else None
        with open_trace_store(resolve_trace_db(trace_db, env)) as store, \
                _export_progress(json_output, "pulling container files") as progress:
            result = pull_traces(app_ref, store, env, volume=volume, cli=cli,
                                 on_file=progress)
    if json_output:
        print_json(result.to_dict())
        _exit_if_unread(result)
        return
    out = console()
    for c in result.containers:
        got = f"{c.bytes:,} bytes" if c.bytes else "nothing new"
        out.print(f"  {_esc(c.container)}: {c.added} new, {c.skipped} already here "
                  f"({plural(c.files, 'file')}, {got})", highlight=False)
    out.print(f"pulled {plural(len(result.files), 'file')} of "
              f"{plural(len(result.containers), 'container')} from the Volume "
              f"{_esc(result.volume)}: {result.added} session(s) added, {result.skipped} "
              f"already in {_esc(result.trace_db)}"
              + (f"; {plural(len(result.unread), 'file')} not merged (below)"
                 if result.unread else ""), highlight=False)
    if result.amended:
        out.print(f"  {plural(result.amended, 'session')} marked as errors: the container "
                  "found, after copying them, that their clients never got the answer",
                  highlight=False)
    if not result.files and not result.unread:
        warn(f"no trace files in {result.volume}/{result.folder} yet: has the app answered a "
             "rollout, and had time to commit?")
    for unread in result.unread:
        print_error(f"{result.volume}:{unread.path} was not merged: {unread.reason}",
                    f"{unread.hint}; inspect it: {unread.inspect} (this pull's copy: "
                    f"{unread.copy})")
    _exit_if_unread(result)


def _exit_if_unread(result) -> None:
    if result.unread:
        raise typer.Exit(EXIT_FAILURE)


@traces_app.command("export")
def export(
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="JSONL file to write (--format sft or tokens).")] = None,
    fmt: Annotated[str, typer.Option(
        "--format", help="sft: chat examples as JSONL; tokens: one row of token ids, loss "
                         "mask and logprobs per episode; otlp: spans to an OpenTelemetry "
                         "receiver (--endpoint).")] = "sft",
    min_reward: Annotated[float | None, typer.Option(
        "--min-reward", help="Keep sessions with outcome reward ≥ this.")] = None,
    app: Annotated[str | None, typer.Option("--app", help="Only this app id.")] = None,
    model: Annotated[str | None, typer.Option("--model", help=MODEL_HELP)] = None,
    since: Annotated[str | None, typer.Option(
        "--since", help="Only newer sessions: 24h, 7d, or an ISO date/time (UTC).")] = None,
    limit: Annotated[int | None, typer.Option(
        "--limit", min=1, help="Max examples (sft), episodes (tokens) or rollouts (otlp).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace --out if it exists.")] = False,
    endpoint: Annotated[str | None, typer.Option(
        "--endpoint", help="OTLP/HTTP receiver (--format otlp): a base URL (/v1/traces is "
                           "added) or the full traces URL.")] = None,
    headers: Annotated[list[str] | None, typer.Option(
        "--headers", help="A header for the receiver, K=V (repeatable), e.g. "
                          "x-mlflow-experiment-id=1.", metavar="K=V")] = None,
    include_content: Annotated[bool, typer.Option(
        "--include-content", help="Put prompts and replies on LM spans (off: they may hold "
                                  "private data).")] = False,
    state: Annotated[Path | None, typer.Option(
        "--state", help="Where sent sessions are remembered (default: beside the trace "
                        "file).", show_default=False)] = None,
    resend: Annotated[bool, typer.Option(
        "--resend", help="Send every matching session, even those already sent.")] = False,
    reward_version: Annotated[str | None, typer.Option(
        "--reward-version", help=REWARD_VERSION_HELP)] = None,
    trace_db: TraceDbOption = None, env_file: EnvFilesOption = None,
    json_output: JsonOption = False,
) -> None:
    """Write SFT JSONL (one chat example per policy call), token JSONL (--format tokens: one
    row per episode of the ids the policy saw and sampled), or send rollouts as
    OpenTelemetry spans (--format otlp: one trace per rollout, resumable, idempotent)."""
    with handling_errors(json_output):
        if fmt == "otlp":
            if reward_version is not None:  # spans carry what the rollout recorded
                raise UsageError("--reward-version is for --format sft and tokens: spans "
                                 "carry the reward each rollout recorded",
                                 hint="leave --reward-version out of the OTLP export")
            _export_otlp(endpoint, headers or [], include_content, state, resend, trace_db,
                         env_file, json_output, limit, app=app, model=model, since=since,
                         min_reward=min_reward)
            return
        if fmt not in ("sft", "tokens"):
            raise UsageError(f"unknown --format {fmt!r}", hint="supported: sft, tokens, otlp")
        if out is None:
            raise UsageError(f"--format {fmt} needs --out FILE", hint=f"e.g. --out {fmt}.jsonl")
        if fmt == "tokens":
            _export_tokens(out, trace_db, env_file, json_output, min_reward=min_reward,
                           app=app, model=model, since=since, limit=limit, overwrite=force,
                           reward_version=reward_version)
            return
        with _open(trace_db, env_file) as store, _export_progress(json_output) as progress:
            from synth_deploy.tracing import export_sft

            result = export_sft(store, out, min_reward=min_reward, app=app, model=model,
                                since=since, limit=limit, overwrite=force,
                                reward_version=reward_version, progress=progress)
    if json_output:
        print_json(result.to_dict())
        return
    console().print(f"wrote {result.examples} example(s) from {result.sessions} session(s) "
                    f"to {result.path} in {result.seconds:.2f}s" + (
                        f" (rewards: version {reward_version})" if reward_version else ""),
                    markup=False)
    if result.note:
        warn(result.note)


def _export_tokens(out: Path, trace_db: Any, env_file: Any, json_output: bool,
                   **filters: Any) -> None:
    """`traces export --format tokens`: one training row per sample of an episode."""
    with _open(trace_db, env_file) as store:
        from synth_deploy.tracing import export_tokens

        result = export_tokens(store, out, **filters)
    if json_output:
        print_json(result.to_dict())
        return
    console().print(f"wrote {result.episodes} episode(s) as {result.rows} row(s), "
                    f"{result.tokens} token(s) "
                    f"({result.sampled_tokens} sampled) to {result.path} in "
                    f"{result.seconds:.2f}s", markup=False)
    if result.note:
        warn(result.note)


def _export_otlp(endpoint: str | None, headers: list[str], include_content: bool,
                 state: Path | None, resend: bool, trace_db: str | None,
                 env_file: list[Path] | None, json_output: bool, limit: int | None,
                 **filters: Any) -> None:
    """`traces export --format otlp`: stored rollouts as spans to an OTLP/HTTP receiver."""
    if not endpoint:
        raise UsageError("--format otlp needs --endpoint URL",
                         hint="e.g. --endpoint http://127.0.0.1:5000 --headers "
                              "x-mlflow-experiment-id=1 (MLflow), or http://127.0.0.1:6006 "
                              "(Phoenix), http://127.0.0.1:4318 (a collector)")
    from synth_deploy.otel import (
        OTEL_EXTRA_HINT,
        OtlpExportOptions,
        export_otlp,
        otel_installed,
        otlp_setting,
    )

    setting = otlp_setting(endpoint, headers, capture_content=include_content)
    if not otel_installed():
        raise UsageError("the OpenTelemetry packages are not installed", hint=OTEL_EXTRA_HINT)
    from synth_deploy.tracing import SessionFilter, since_timestamp

    since = filters.pop("since")
    where = SessionFilter(**filters, since=since_timestamp(since) if since else None)
    options = OtlpExportOptions(where=where, limit=limit, state=state, resend=resend)
    with _open(trace_db, env_file) as store, _export_progress(json_output) as progress:
        result = export_otlp(store, setting, options, on_progress=(
            None if progress is None else lambda done, total, spans: progress(done, total)))
    if json_output:
        print_json(result.to_dict())
    else:
        console().print(f"sent {result.sent} rollout(s) as {result.spans} span(s) to "
                        f"{result.endpoint} in {result.seconds:.2f}s; {result.already_sent} "
                        f"sent before were skipped (state: {result.state})", markup=False,
                        soft_wrap=True)


@traces_app.command("view")
def view(
    port: Annotated[int, typer.Option(
        "--port", min=0, max=65535, help="Port to listen on (0: any free port).")] = 8765,
    host: Annotated[str, typer.Option(
        "--host", help="Address to bind. Anything but loopback shows the traces to everyone "
                       "who can reach it.")] = "127.0.0.1",
    no_browser: Annotated[bool, typer.Option(
        "--no-browser", help="Do not open a browser tab.")] = False,
    trace_db: TraceDbOption = None, env_file: EnvFilesOption = None,
) -> None:
    """Browse traces in a local web page: sessions, rewards, replays, compare, SFT export."""
    with handling_errors(), _open(trace_db, env_file) as store:
        from synth_deploy.viewer import ViewerOptions, serve_viewer

        options = ViewerOptions(host=host, port=port, open_browser=not no_browser)

        def ready(url: str) -> None:
            out = console()
            out.print(f"viewer on {url} (read-only over {store.display}); Ctrl-C stops it",
                      markup=False, soft_wrap=True)
            bound = url.rsplit(":", 1)[1]
            if options.loopback:
                out.print(f"  from another machine: ssh -N -L {bound}:127.0.0.1:{bound} "
                          f"<this host>, then open http://127.0.0.1:{bound}", markup=False,
                          soft_wrap=True)
            else:
                warn(f"listening on {host}: anyone who can reach port {bound} can read these "
                     "traces")

        try:
            serve_viewer(store, options, on_ready=ready)
        except KeyboardInterrupt:
            console().print("viewer stopped", markup=False)
