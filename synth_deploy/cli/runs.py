"""CLI: `smoke` and `eval` — rollouts against a task app, a per-seed table and a summary."""

from __future__ import annotations

from typing import Annotated

import typer

from synth_deploy.cli._common import (
    EXIT_FAILURE,
    ApiKeyOption,
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
    folded,
    handling_errors,
    parse_seeds,
    plural,
    print_json,
    resolve_env,
    resolve_traces,
    traces_where,
)

AppOrUrlArg = Annotated[str, typer.Argument(metavar="APP_OR_URL",
                                            help="An app id or path (served here), or the "
                                                 "URL of a running task app.")]
ConcurrencyOption = Annotated[int, typer.Option(min=1, max=512, help="Rollouts in flight.")]
PolicyOption = Annotated[str, typer.Option(help="'mock' for the built-in mock policy.")]
InferenceUrlOption = Annotated[str | None, typer.Option(
    help="OpenAI-compatible base URL of a real policy (replaces the mock).")]
ModelOption = Annotated[str | None, typer.Option(help="Model name sent to the policy.")]
MaxTimeOption = Annotated[float, typer.Option(help="Per-rollout bound in seconds.")]
StopAfterOption = Annotated[int, typer.Option(
    "--stop-after", min=0, help="Stop the run after this many failed rollouts in a row "
    "(0: never); a failure the app marks retryable is retried once first.")]


def register(app: typer.Typer) -> None:
    app.command("smoke")(smoke)
    app.command("eval")(evaluate)
    app.command("mock-policy")(mock_policy)


def mock_policy(
    port: Annotated[int, typer.Option(help="Port to listen on.", min=1, max=65535)] = 8002,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
) -> None:
    """Serve the built-in mock policy until Ctrl+C.

    An OpenAI-compatible POST /v1/chat/completions (tool calls drawn from the offered tools'
    schemas, answers to arithmetic) and GET /v1/models: for curl, a trainer, or an app's
    --inference-url.
    """
    with handling_errors():
        import signal
        import threading

        from synth_deploy.runs import MOCK_MODEL, create_mock_policy_app
        from synth_deploy.serving import BackgroundServer

        stopped = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stopped.set())
        server = BackgroundServer(create_mock_policy_app(), host=host, port=port).start()
        console(stderr=True).print(f"mock policy at {server.url}/v1  model {MOCK_MODEL}  "
                                   "(Ctrl+C stops it)", highlight=False)
        try:
            while not stopped.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
        finally:
            server.stop()


def smoke(
    app_or_url: AppOrUrlArg,
    seeds: Annotated[str, typer.Option(help="Seeds: 0-9, 1,3,5 or mixes.")] = "0-9",
    concurrency: ConcurrencyOption = 8,
    policy: PolicyOption = "mock",
    inference_url: InferenceUrlOption = None,
    model: ModelOption = None,
    max_time: MaxTimeOption = 300.0,
    stop_after: StopAfterOption = 10,
    api_key: ApiKeyOption = None,
    env_file: EnvFilesOption = None,
    trace_db: TraceDbOption = None,
    no_trace: NoTraceOption = False,
    prices: PricesOption = None,
    json_output: JsonOption = False,
) -> None:
    """Run rollouts against a task app.

    Serves the app here when given an id, uses the built-in mock policy unless
    --inference-url is given, and prints a per-seed table and a summary. Columns: reward
    (the rollout's), outcome (its outcome score: the reward unless the app gives a judged
    score), events (the mean of the event rewards its steps recorded; - when none).
    """
    with handling_errors(json_output):
        from synth_deploy.runs import RunOptions

        env = _target_env(app_or_url, env_file, api_key)
        _run_and_report(app_or_url, parse_seeds(seeds), env,
                        RunOptions(mode="rl", concurrency=concurrency, max_time_s=max_time,
                                   stop_after_failures=stop_after or None),
                        policy=_policy(policy, inference_url, model, env),
                        traces=resolve_traces(trace_db, no_trace, env), json_output=json_output,
                        prices=_prices(prices, env))


def evaluate(
    app_or_url: AppOrUrlArg,
    seeds: Annotated[str | None, typer.Option(
        help="Seeds: 0-9, 1,3,5 or mixes (default: the split's default seeds, else 0-9).")
    ] = None,
    split: Annotated[str | None, typer.Option(
        help="Dataset split, e.g. train or test (default: the split the app declares as its "
             "default).", show_default=False)] = None,
    model: ModelOption = None,
    inference_url: InferenceUrlOption = None,
    policy: PolicyOption = "mock",
    concurrency: ConcurrencyOption = 8,
    max_time: MaxTimeOption = 300.0,
    stop_after: StopAfterOption = 10,
    api_key: ApiKeyOption = None,
    env_file: EnvFilesOption = None,
    trace_db: TraceDbOption = None,
    no_trace: NoTraceOption = False,
    prices: PricesOption = None,
    json_output: JsonOption = False,
) -> None:
    """Evaluate a policy on a task app.

    Rollouts in eval mode: per-seed rewards, judge scores, a summary; traces stored.
    """
    with handling_errors(json_output):
        from synth_deploy.runs import RunOptions, default_seeds, default_split

        env = _target_env(app_or_url, env_file, api_key)
        target_policy = _policy(policy, inference_url, model, env)
        note = None
        if seeds is not None:
            seed_list = parse_seeds(seeds)
        elif split is not None:
            seed_list = default_seeds(app_or_url, split, env)
        elif (declared := default_split(app_or_url, env)) is not None:
            split, seed_list = declared
            note = (f"seeds: the {len(seed_list)} default seeds of the app's default split "
                    f"{split!r} (--seeds or --split to choose)")
        else:
            seed_list = parse_seeds("0-9")
        _run_and_report(app_or_url, seed_list, env,
                        RunOptions(mode="eval", concurrency=concurrency, max_time_s=max_time,
                                   split=split, stop_after_failures=stop_after or None),
                        policy=target_policy, traces=resolve_traces(trace_db, no_trace, env),
                        json_output=json_output, prices=_prices(prices, env), note=note)


def _target_env(app_or_url: str, env_file, api_key: str | None):
    """The `Env` of a run: ``--api-key`` is the key of the app at a URL (one served here
    gets its own)."""
    from synth_deploy.errors import UsageError
    from synth_deploy.runs import is_url

    if api_key and not is_url(app_or_url):
        raise UsageError(f"--api-key is the key of a task app at a URL; {app_or_url!r} is "
                         "served here with a key of its own",
                         hint="drop --api-key, or pass the running app's URL")
    return resolve_env(env_file, api_key=api_key)


def _policy(policy: str, inference_url: str | None, model: str | None, env):
    """The policy the flags name: None for the built-in mock."""
    from synth_deploy.errors import UsageError
    from synth_deploy.runs import policy_target

    if policy != "mock" and not inference_url:
        raise UsageError(f"unknown --policy {policy!r}",
                         hint="use --policy mock, or --inference-url U --model M")
    return policy_target(inference_url, model, env)


def _prices(flag, env):
    """The price table of ``--prices``/``SYNTH_PRICES``, read before any rollout runs."""
    from synth_deploy.tracing import resolve_price_table

    return resolve_price_table(flag, env)


def _run_and_report(app_or_url: str, seeds: list[int], env, options, *, policy, traces,
                    json_output: bool, prices=None, note: str | None = None) -> None:
    """Run the seeds with a progress bar, render the report, exit 1 on any rollout error."""
    from synth_deploy.runs import run_suite

    with _progress(len(seeds), enabled=not json_output) as advance:
        report = run_suite(app_or_url, seeds, env, options=options, policy=policy,
                           traces=traces, on_outcome=advance)
    if note:
        report.notes.append(note)
    if json_output:
        ledger = report.ledger
        print_json({**report.to_dict(), "traces": traces_where(traces),
                    "cost_estimate": cost_lines(ledger, prices)[1] if ledger else None})
    else:
        _render_report(report, traces_where(traces), prices)
    if report.errors:
        raise typer.Exit(EXIT_FAILURE)


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


def _secs(value: float | None) -> str:
    return "n/a (no rollout finished)" if value is None else f"{value:.3f}s"


def _render_report(report, where: str, prices=None) -> None:
    from rich import box

    out = console()
    for note in report.notes:
        out.print(f"[dim]{escape(note)}[/dim]")
    columns = [Column("seed", justify="right"), Column("status"), Column("reward"),
               Column("outcome", optional=True), Column("events", optional=True),
               Column("latency s"), Column("details", wrap=True, min_width=20)]
    rows = [_outcome_row(o) for o in report.outcomes]
    out.print(fitted_table(columns, rows, width=out.width, box=box.SIMPLE_HEAD))
    _print_failures(out, report)
    if report.stopped:
        out.print(f"[red]{escape(report.stopped)}[/red]", soft_wrap=True)
    warned = [o for o in report.outcomes if o.warning]
    if warned:
        out.print(f"[yellow]{plural(len(warned), 'warning')}:[/yellow]")
        for o in warned:
            out.print(f"  seed {o.seed} ({o.run_id}): {escape(o.warning)}", soft_wrap=True,
                      highlight=False)
    out.print(folded(_summary_line(report), out.width), soft_wrap=True)
    if (ledger := report.ledger) is not None:
        out.print(escape(folded(cost_lines(ledger, prices)[0], out.width)), soft_wrap=True)
    out.print(f"traces → {escape(where)}", soft_wrap=True)


def _outcome_row(o) -> list[str]:
    """One rollout's table row; a failure's cause is printed whole below the table, never
    cut to fit a cell."""
    if o.ok:
        detail = escape(" ".join(f"{k}={v}" for k, v in list(o.details.items())[:3]))
        return [str(o.seed), "[green]ok[/green]", _fmt(o.reward), _fmt(o.outcome_score),
                _fmt(o.events_score), _fmt(o.latency_s, 3), detail]
    return [str(o.seed), f"[red]{o.status or 'error'}[/red]", "-", "-", "-",
            _fmt(o.latency_s, 3), "[red]failed, see below[/red]"]


def _print_failures(out, report) -> None:
    """Each failed rollout's whole cause (its kind, whether a retry may help, its attempts),
    then the count by kind."""
    failed = [o for o in report.outcomes if not o.ok]
    if not failed:
        return
    out.print(f"[red]{plural(len(failed), 'failed rollout')}:[/red]")
    for o in failed:
        who = "" if o.kind is None else \
            f" [{o.kind}{', retryable' if o.retryable else ''}]"
        tries = f" after {o.attempts} attempts" if o.attempts > 1 else ""
        out.print(f"  seed {o.seed} ({o.run_id}){escape(who)}{tries}: {escape(o.error)}",
                  soft_wrap=True, highlight=False)
    kinds = ", ".join(f"{kind} {n}" for kind, n in report.failure_kinds.items())
    out.print(f"  by kind: {kinds}", highlight=False)


def _summary_line(report) -> str:
    """The run in one line: rollouts, errors, mean scores (over the ok ones: failed rollouts
    have no reward, and the line says so), tokens, latency, elapsed time."""
    s = report.summary()
    tokens = f" · {s['tokens']} tokens" if s["tokens"] is not None else ""
    over = f" over {s['ok']} ok ({s['errors']} failed left out)" if s["errors"] else ""
    return (
        f"{plural(s['rollouts'], 'rollout')} ({report.mode}), {plural(s['errors'], 'error')} · "
        f"mean reward {_fmt(s['mean_reward'], 3)}{over} · outcome "
        f"{_fmt(s['mean_outcome_score'], 3)} · events {_fmt(s['mean_events_score'], 3)}{tokens}"
        f" · p50 {_secs(s['latency_p50_s'])} · p95 {_secs(s['latency_p95_s'])} · "
        f"{s['elapsed_s']:.2f}s at concurrency {report.concurrency}")
