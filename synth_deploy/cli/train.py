"""CLI: `synth-deploy train` — submit RL or SFT jobs to the training backend and follow them."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from synth_deploy.cli._common import (
    EXIT_USAGE,
    EnvFilesOption,
    console,
    escape,
    handling_errors,
    print_error,
    resolve_env,
    warn,
)
from synth_deploy.env import redact_userinfo
from synth_deploy.errors import JobHTTPError, UsageError

HELP = """Submit RL or SFT jobs from TOML configs.

Then follow them to a terminal status.

Without --config, configs in the working tree are found and (on a terminal) offered in a
picker. Keys are checked first: SYNTH_API_KEY, ENVIRONMENT_API_KEY and (RL) the task URL
(--task-url > TASK_APP_URL > [services].task_url). RL jobs are preflighted: the backend
verifies the task app, and our health check probes auth, /health and /task_info. SFT data is
validated line by line before upload. Several --config run in order, stopping at the first
failure.

Exit codes: 0 job succeeded (or submitted with --no-poll, or --dry-run) · 1 job failed or
was cancelled, preflight failed, or the backend refused · 2 bad flags, config or data ·
3 task app unreachable · 4 still running at --poll-timeout · 130 interrupted.
"""


def register(app: typer.Typer) -> None:
    app.command("train", help=HELP)(train)


def _pick(found: list[Path]) -> list[Path]:
    if not found:
        raise UsageError("no training config found under the working directory",
                         hint="pass --config FILE (see apps/math/configs/rl.toml, sft.toml)")
    if not sys.stdin.isatty():
        listing = "\n".join(f"  {p}" for p in found)
        raise UsageError(f"no --config given; found {len(found)} config(s):\n{listing}",
                         hint="pass one with --config FILE (no picker without a terminal)")
    out = console()
    for i, p in enumerate(found, 1):
        out.print(f"  [bold]{i}[/bold]. {escape(p)}", markup=True, highlight=False)
    choice = typer.prompt("Pick a config (number)", type=int, default=1)
    if not 1 <= choice <= len(found):
        raise UsageError(f"no config numbered {choice}", hint=f"choose 1 to {len(found)}")
    return [found[choice - 1]]


def _render_http_error(exc: JobHTTPError, json_output: bool) -> None:
    """Status, masked payload and body on stderr; with --stream-format json also one last
    NDJSON line on stdout (the library masked the secrets in all of them)."""
    import json

    err = console(stderr=True)
    print_error(exc.message)
    if exc.payload is not None:
        err.print("request payload (secrets masked):", markup=False, highlight=False)
        err.print(json.dumps(exc.payload, indent=2, default=str), markup=False, highlight=False)
    err.print(f"response body: {exc.body or '(empty)'}", markup=False, highlight=False)
    if exc.hint:
        err.print(f"  [dim]hint:[/dim] {escape(exc.hint)}", markup=True, highlight=False)
    if json_output:
        error = {"type": "JobHTTPError", "message": exc.message, "status": exc.status,
                 "body": exc.body, "payload": exc.payload, "hint": exc.hint}
        sys.stdout.write(json.dumps({"ok": False, "error": error}, default=str) + "\n")
        sys.stdout.flush()


def train(
    config: Annotated[list[Path] | None, typer.Option(
        "--config", metavar="FILE", help="Training TOML (repeatable; run in order).",
        show_default=False)] = None,
    type_: Annotated[str, typer.Option("--type", metavar="auto|rl|sft",
                                           help="Job type (default: from the config).")] = "auto",
    env_files: EnvFilesOption = None,
    task_url: Annotated[str | None, typer.Option(help="RL task app URL.")] = None,
    dataset: Annotated[Path | None, typer.Option(help="SFT JSONL (overrides the config).")] = None,
    backend: Annotated[str | None, typer.Option(
        help="Backend base URL (else SYNTH_BACKEND_URL, else https://api.usesynth.ai).")] = None,
    model: Annotated[str | None, typer.Option(help="Override the config's model.")] = None,
    allow_experimental: Annotated[bool | None, typer.Option(
        "--allow-experimental/--no-allow-experimental",
        help="Allow experimental models (sent only when given).")] = None,
    idempotency: Annotated[str | None, typer.Option(
        help="Idempotency-Key for job creation (default: a new one per job).")] = None,
    poll: Annotated[bool, typer.Option("--poll/--no-poll", help="Follow the job.")] = True,
    poll_timeout: Annotated[float, typer.Option(help="Seconds to follow a job.")] = 3600.0,
    poll_interval: Annotated[float, typer.Option(help="Seconds between status polls.")] = 5.0,
    stream_format: Annotated[str, typer.Option(
        metavar="cli|chart|json", help="Events as lines, a loss chart, or NDJSON.")] = "cli",
    examples: Annotated[int | None, typer.Option(
        help="SFT: train on the first N examples only.")] = None,
    dry_run: Annotated[bool, typer.Option(help="Print the exact payload; send nothing.")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask before submitting.")] = False,
) -> None:
    json_output = stream_format == "json"
    code = 0
    with handling_errors(json_output):
        if stream_format not in ("cli", "chart", "json"):
            raise UsageError(f"--stream-format must be cli, chart or json, got {stream_format!r}")
        from synth_deploy.train import (
            ChartHandler,
            CliHandler,
            JsonHandler,
            TrainOptions,
            TrainUI,
            discover_configs,
        )
        from synth_deploy.train import train as run_train

        paths = list(config or []) or _pick(discover_configs(Path.cwd()))
        out, err = console(), console(stderr=True)

        def info(msg: str) -> None:
            err.print(f"[dim]›[/dim] {escape(msg)}", markup=True, highlight=False)

        def confirm(job) -> bool:
            target = job.task_url or (job.dataset and str(job.dataset))
            return typer.confirm(redact_userinfo(
                f"Submit {job.kind.upper()} job from {job.config.path.name} ({target}) to "
                f"{job.backend_url}?"), default=True)

        def show_plan(plan: dict) -> None:
            import json

            if json_output:
                sys.stdout.write(json.dumps(plan, default=str) + "\n")
            else:
                out.print(json.dumps(plan, indent=2, default=str), markup=False,
                          highlight=False)

        handler = {"json": lambda job_id: JsonHandler(),
                   "chart": lambda job_id: ChartHandler(out, job_id),
                   "cli": lambda job_id: CliHandler(out)}[stream_format]
        ui = TrainUI(info=info, warn=warn, show_dry_run=show_plan, handler=handler,
                     confirm=None if (yes or not sys.stdin.isatty()) else confirm)
        options = TrainOptions(
            configs=paths, kind=type_, task_url=task_url, dataset=dataset, backend=backend,
            model=model, allow_experimental=allow_experimental, idempotency_key=idempotency,
            poll=poll, poll_timeout_s=poll_timeout, poll_interval_s=poll_interval,
            examples=examples, dry_run=dry_run)
        env = resolve_env(env_files)
        try:
            results = run_train(options, env, ui)
        except JobHTTPError as exc:
            _render_http_error(exc, json_output)
            raise typer.Exit(exc.exit_code) from None
        _report_results(results, err, info, dry_run=dry_run, json_output=json_output,
                        poll_timeout=poll_timeout)
        code = results[-1].exit_code if results else EXIT_USAGE
    raise typer.Exit(code)


def _report_results(results: list[Any], err: Any, info: Callable[[str], None], *,
                    dry_run: bool, json_output: bool, poll_timeout: float) -> None:
    """One line a job on stderr: not followed, still running at --poll-timeout, or how it
    ended (in --json the NDJSON events already said so)."""
    from synth_deploy.train import EXIT_POLL_TIMEOUT

    for result in results:
        if result.outcome is None:
            if not dry_run:
                info(f"{result.config.name}: submitted job {result.job_id} (not followed)")
            continue
        oc = result.outcome
        if oc.timed_out:
            err.print(f"[yellow]job {escape(oc.job_id)} still {escape(oc.status)} after "
                      f"{poll_timeout:g}s[/yellow] (exit {EXIT_POLL_TIMEOUT}); it keeps "
                      f"running on the backend", markup=True, highlight=False)
        elif not json_output:
            style = "green" if oc.succeeded else "red"
            extra = oc.job.get("model_id") or oc.job.get("error") or ""
            err.print(f"[{style}]job {escape(oc.job_id)} {escape(oc.status)}[/{style}] "
                      f"{escape(extra)}", markup=True, highlight=False)
