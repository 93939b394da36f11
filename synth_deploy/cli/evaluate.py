"""CLI: `eval` — rollouts in eval mode with judge metrics, traces written to the store."""

from __future__ import annotations

from typing import Annotated

import typer

from synth_deploy.cli._common import (
    EXIT_FAILURE,
    EnvFilesOption,
    JsonOption,
    NoTraceOption,
    TraceDbOption,
    handling_errors,
    parse_seeds,
)
from synth_deploy.cli.taskapp import (
    ConcurrencyOption,
    InferenceUrlOption,
    MaxTimeOption,
    ModelOption,
    PolicyOption,
    check_policy_flag,
    run_and_report,
)


def register(app: typer.Typer) -> None:
    app.command("eval")(evaluate)


def evaluate(
    app_or_url: Annotated[str, typer.Argument(help="An app id or path (served here), or the "
                                                   "URL of a running task app.")],
    seeds: Annotated[str | None, typer.Option(
        help="Seeds: 0-9, 1,3,5 or mixes (default: the split's default seeds, else 0-9).")
    ] = None,
    split: Annotated[str | None, typer.Option(help="Dataset split, e.g. train or test.")] = None,
    model: ModelOption = None,
    inference_url: InferenceUrlOption = None,
    policy: PolicyOption = "mock",
    concurrency: ConcurrencyOption = 8,
    max_time: MaxTimeOption = 300.0,
    env_file: EnvFilesOption = None,
    trace_db: TraceDbOption = None,
    no_trace: NoTraceOption = False,
    json_output: JsonOption = False,
) -> None:
    """Evaluate a policy on a task app.

    Rollouts in eval mode: per-seed rewards, judge scores, a summary; traces stored.
    """
    with handling_errors(json_output):
        check_policy_flag(policy, inference_url)
        if seeds is not None:
            seed_list = parse_seeds(seeds)
        elif split is not None:
            from synth_deploy.env import load_env
            from synth_deploy.jobs.runs import default_seeds

            seed_list = default_seeds(app_or_url, split, load_env(env_file or ()))
        else:
            seed_list = parse_seeds("0-9")
        report, _ = run_and_report(app_or_url, seed_list, mode="eval", concurrency=concurrency,
                                   inference_url=inference_url, model=model,
                                   max_time_s=max_time, env_files=env_file, trace_db=trace_db,
                                   no_trace=no_trace, json_output=json_output, split=split)
        if report.errors:
            raise typer.Exit(EXIT_FAILURE)

