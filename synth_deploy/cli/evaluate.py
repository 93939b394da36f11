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
from synth_deploy.errors import UsageError


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
            seed_list = _split_seeds(app_or_url, split, env_file)
        else:
            seed_list = parse_seeds("0-9")
        report, _ = run_and_report(app_or_url, seed_list, mode="eval", concurrency=concurrency,
                                   inference_url=inference_url, model=model,
                                   max_time_s=max_time, env_files=env_file, trace_db=trace_db,
                                   no_trace=no_trace, json_output=json_output, split=split)
        if report.errors:
            raise typer.Exit(EXIT_FAILURE)


def _split_seeds(app_or_url: str, split: str, env_files) -> list[int]:
    """The default seeds a task app advertises for ``split`` (from its registry or /info)."""
    from synth_deploy.jobs.runs import is_url

    if is_url(app_or_url):
        import httpx

        from synth_deploy.env import load_env

        key = load_env(env_files or ()).get("ENVIRONMENT_API_KEY") or ""
        try:
            info = httpx.get(app_or_url.rstrip("/") + "/info", headers={"X-API-Key": key},
                             timeout=15, follow_redirects=True).json()
            datasets = info["dataset"]["datasets"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"cannot read the default seeds of split {split!r} from "
                             f"{app_or_url}/info: {exc}", hint="pass --seeds") from None
    else:
        from synth_deploy.taskapp.registry import load_app

        datasets = load_app(app_or_url).build_config().dataset_registry.describe()
    for dataset in datasets:
        seeds = (dataset.get("default_seeds") or {}).get(split)
        if seeds:
            return list(seeds)
    known = sorted({s for d in datasets for s in (d.get("default_seeds") or {})})
    raise UsageError(f"the app advertises no default seeds for split {split!r}",
                     hint=f"splits with seeds: {', '.join(known) or 'none'}; or pass --seeds")
