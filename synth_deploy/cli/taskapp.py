"""CLI: `serve`, `apps`, `setup`, `smoke` — working with task apps on this machine."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from synth_deploy.cli._common import (
    EXIT_FAILURE,
    EnvFilesOption,
    JsonOption,
    NoTraceOption,
    TraceDbOption,
    console,
    escape,
    handling_errors,
    open_traces,
    parse_seeds,
    print_json,
    warn,
)
from synth_deploy.errors import UsageError

AppArg = Annotated[str, typer.Argument(help="An app id (see `synth-deploy apps`) or a path "
                                            "to a task app file.", show_default=False)]
# Shared by `smoke` and `eval`.
ConcurrencyOption = Annotated[int, typer.Option(min=1, max=512, help="Rollouts in flight.")]
PolicyOption = Annotated[str, typer.Option(help="'mock' for the built-in mock policy.")]
InferenceUrlOption = Annotated[str | None, typer.Option(
    help="OpenAI-compatible base URL of a real policy (replaces the mock).")]
ModelOption = Annotated[str | None, typer.Option(help="Model name sent to the policy.")]
MaxTimeOption = Annotated[float, typer.Option(help="Per-rollout bound in seconds.")]


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
    app.command("apps")(apps)
    app.command("setup")(setup)
    app.command("smoke")(smoke)


def serve(
    app_ref: AppArg,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8001,
    reload: Annotated[bool, typer.Option("--reload", help="Restart when files change.")] = False,
    env_file: EnvFilesOption = None,
    trace_db: TraceDbOption = None,
    no_trace: NoTraceOption = False,
) -> None:
    """Serve a task app locally.

    uvicorn on HOST:PORT; SIGTERM drains in-flight rollouts before exiting.
    """
    with handling_errors():
        from synth_deploy.env import apply_env, load_env, mask
        from synth_deploy.taskapp.registry import load_app
        from synth_deploy.taskapp.serving import ensure_port_free

        env = load_env(env_file or ())
        apply_env(env)  # vendor proxy keys and app settings are read from os.environ
        entry = load_app(app_ref)
        ensure_port_free(host, port)
        keys = env.api_keys()
        if not keys:
            warn("no ENVIRONMENT_API_KEY is configured: authenticated endpoints answer 503. "
                 "Run `synth-deploy setup` to mint one into .env, then restart.")
        store, where = open_traces(trace_db, no_trace, env)
        out = console(stderr=True)
        out.print(f"serving [bold]{escape(entry.app_id)}[/bold] at http://{host}:{port}  "
                  f"key {mask(keys[0]) if keys else '(none)'}  traces → {where}")
        if reload:
            from synth_deploy.taskapp.serving import serve_with_reload

            # The reloaded child opens its own store; this process only resolved where.
            trace_url = store.setting.url if store is not None else None
            if store is not None:
                store.close()
            folders = [str(entry.source.parent)] if entry.source else []
            serve_with_reload(app_ref, host=host, port=port, reload_dirs=folders,
                              trace_db=trace_url)
            return
        from synth_deploy.taskapp.server import create_app
        from synth_deploy.taskapp.serving import serve as serve_forever

        try:
            serve_forever(create_app(entry.build_config(), api_keys=keys, trace_store=store),
                          host=host, port=port)
        finally:
            if store is not None:
                store.close()


def apps(json_output: JsonOption = False) -> None:
    """List the task apps found here.

    Looks under ./apps and the kit's bundled examples, without importing them.
    """
    from synth_deploy.taskapp.registry import discover_apps

    found = discover_apps()
    if json_output:
        print_json([a.to_dict() for a in found])
        return
    if not found:
        console().print("no task apps found under ./apps")
        return
    from rich.table import Table

    table = Table("id", "description", "file")
    for a in found:
        table.add_row(a.app_id, a.description, str(a.path))
    console().print(table)


def setup(
    env_file: Annotated[Path, typer.Option("--env-file", help="The .env file to write.")] = Path(
        ".env"),
    force: Annotated[bool, typer.Option("--force", help="Replace an existing key.")] = False,
    json_output: JsonOption = False,
) -> None:
    """Mint ENVIRONMENT_API_KEY into .env.

    Every other line of the file is kept; the key is shown masked.
    """
    with handling_errors(json_output):
        from synth_deploy.env import (
            ENVIRONMENT_API_KEY,
            mask,
            mint_key,
            parse_env_file,
            write_env_var,
        )

        existing = parse_env_file(env_file).get(ENVIRONMENT_API_KEY) if env_file.exists() else None
        if existing and not force:
            key, action = existing, "kept"
        else:
            key, action = mint_key(), ("replaced" if existing else "created")
            write_env_var(env_file, ENVIRONMENT_API_KEY, key)
        if json_output:
            print_json({"ok": True, "env_file": str(env_file), "action": action,
                        "key": mask(key)})
            return
        console().print(f"{ENVIRONMENT_API_KEY} {action} in {env_file}: {mask(key)}")
        if action == "kept":
            console().print("  (pass --force to mint a new one)")


def smoke(
    app_or_url: Annotated[str, typer.Argument(help="An app id or path (served here), or the "
                                                   "URL of a running task app.")],
    seeds: Annotated[str, typer.Option(help="Seeds: 0-9, 1,3,5 or mixes.")] = "0-9",
    concurrency: ConcurrencyOption = 8,
    policy: PolicyOption = "mock",
    inference_url: InferenceUrlOption = None,
    model: ModelOption = None,
    max_time: MaxTimeOption = 300.0,
    env_file: EnvFilesOption = None,
    trace_db: TraceDbOption = None,
    no_trace: NoTraceOption = False,
    json_output: JsonOption = False,
) -> None:
    """Run rollouts against a task app.

    Serves the app here when given an id, uses the built-in mock policy unless
    --inference-url is given, and prints a per-seed table and a summary.
    """
    with handling_errors(json_output):
        check_policy_flag(policy, inference_url)
        report, where = run_and_report(app_or_url, parse_seeds(seeds), mode="rl",
                                       concurrency=concurrency, inference_url=inference_url,
                                       model=model, max_time_s=max_time, env_files=env_file,
                                       trace_db=trace_db, no_trace=no_trace,
                                       json_output=json_output)
        if report.errors:
            raise typer.Exit(EXIT_FAILURE)


def run_and_report(app_or_url: str, seeds: list[int], *, mode: str, concurrency: int,
                   inference_url: str | None, model: str | None, max_time_s: float,
                   env_files: list[Path] | None, trace_db: str | None, no_trace: bool,
                   json_output: bool, split: str | None = None):
    """Shared by `smoke` and `eval`: run the seeds with a progress bar, then render."""
    from synth_deploy.env import load_env
    from synth_deploy.jobs.runs import run_suite

    env = load_env(env_files or ())
    store, where = open_traces(trace_db, no_trace, env)
    try:
        with _progress(len(seeds), enabled=not json_output) as advance:
            report = run_suite(app_or_url, seeds, env, mode=mode, concurrency=concurrency,
                               inference_url=inference_url, model=model, split=split,
                               max_time_s=max_time_s, trace_store=store, on_outcome=advance)
    finally:
        if store is not None:
            store.close()
    if json_output:
        print_json({**report.to_dict(), "traces": where})
    else:
        _render_report(report, where)
    return report, where


def check_policy_flag(policy: str, inference_url: str | None) -> None:
    if policy != "mock" and not inference_url:
        raise UsageError(f"unknown --policy {policy!r}",
                         hint="use --policy mock, or --inference-url U --model M")


class _progress:
    """A rich progress bar on stderr; yields a callback that advances it by one rollout."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self._progress = total, enabled, None

    def __enter__(self):
        if not self.enabled:
            return lambda outcome: None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        self._progress = Progress("rollouts", BarColumn(), MofNCompleteColumn(),
                                  "[red]{task.fields[errors]} errors", TimeElapsedColumn(),
                                  console=console(stderr=True), transient=True)
        self._progress.start()
        task = self._progress.add_task("rollouts", total=self.total, errors=0)
        errors = 0

        def advance(outcome) -> None:
            nonlocal errors
            errors += not outcome.ok
            self._progress.update(task, advance=1, errors=errors)

        return advance

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()


def _fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _render_report(report, traces_where: str) -> None:
    from rich.table import Table

    out = console()
    for note in report.notes:
        out.print(f"[dim]{escape(note)}[/dim]")
    from rich import box

    table = Table(box=box.SIMPLE_HEAD)
    for name in ("seed", "status", "reward", "outcome", "events", "latency s"):
        table.add_column(name, no_wrap=True, min_width=len(name))
    # The one column that gives way when the terminal is narrow.
    table.add_column("details", overflow="ellipsis", no_wrap=True,
                     max_width=max(12, out.width - 62))
    for o in report.outcomes:
        if o.ok:
            detail = escape(" ".join(f"{k}={v}" for k, v in list(o.details.items())[:3]))
            table.add_row(str(o.seed), "[green]ok[/green]", _fmt(o.reward),
                          _fmt(o.outcome_score), _fmt(o.events_score), _fmt(o.latency_s, 3),
                          detail)
        else:
            table.add_row(str(o.seed), f"[red]{o.status or 'error'}[/red]", "-", "-", "-",
                          _fmt(o.latency_s, 3), f"[red]{escape(o.error)}[/red]")
    out.print(table)
    s = report.summary()
    out.print(
        f"{s['rollouts']} rollouts ({report.mode}), {s['errors']} errors · mean reward "
        f"{_fmt(s['mean_reward'], 3)} · outcome {_fmt(s['mean_outcome_score'], 3)} · events "
        f"{_fmt(s['mean_events_score'], 3)} · p50 {_fmt(s['latency_p50_s'], 3)}s · p95 "
        f"{_fmt(s['latency_p95_s'], 3)}s · {s['elapsed_s']:.2f}s at concurrency "
        f"{report.concurrency}", soft_wrap=True)
    out.print(f"traces → {traces_where}", soft_wrap=True)
