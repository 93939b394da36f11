"""`synth-deploy check URL`: verify a task app at any URL and explain what is wrong.

Exit codes: 0 healthy · 1 unhealthy · 2 usage error (bad flag or URL) · 3 unreachable.
The ``--json`` shape is documented in the docstring of ``synth_deploy/health/_report.py``.
The URL and key are resolved here, once: the URL argument, else TASK_APP_URL; ``--api-key``,
else ENVIRONMENT_API_KEY; both from the `Env` (``--env-file``, the process environment,
./.env). The checker is told where the key came from.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from typing import Annotated, Any, NoReturn

import typer

from synth_deploy.cli._common import (
    ApiKeyOption,
    EnvFilesOption,
    JsonOption,
    console,
    escape,
    handling_errors,
    load_table,
    parse_seeds,
    print_json,
    resolve_env,
)
from synth_deploy.env import redact_userinfo
from synth_deploy.errors import UsageError

_STYLES = {"pass": ("✓ pass", "green"), "fail": ("✗ fail", "red"),
           "warn": ("! warn", "yellow"), "skip": ("- skip", "dim")}


def register(app: typer.Typer) -> None:
    app.command("check")(check_command)


def check_command(
    url: Annotated[str | None, typer.Argument(
        metavar="URL", help="The task app's base URL (local, tunnel or Modal). Default: "
                            "TASK_APP_URL from the environment or .env.",
        show_default=False)] = None,
    api_key: ApiKeyOption = None,
    env_file: EnvFilesOption = None,
    wait: Annotated[float | None, typer.Option(
        "--wait", min=0, metavar="SECONDS",
        help="Poll until healthy or this many seconds pass (cold starts, new tunnels).",
        show_default=False)] = None,
    seeds: Annotated[str, typer.Option(
        "--seeds", help="Seeds whose /task_info to validate, e.g. 0-4 or 1,3,5.")] = "0",
    rollout: Annotated[bool, typer.Option(
        "--rollout", help="Also run one eval-mode rollout (mock policy unless "
                          "--inference-url).")] = False,
    inference_url: Annotated[str | None, typer.Option(
        "--inference-url", help="OpenAI-compatible base URL the rollout's policy calls.",
        show_default=False)] = None,
    model: Annotated[str | None, typer.Option(
        "--model", help="Model name for the rollout's policy.", show_default=False)] = None,
    timeout: Annotated[float, typer.Option(
        "--timeout", min=0.1, metavar="SECONDS", help="Timeout of each request.")] = 10.0,
    load: Annotated[bool, typer.Option(
        "--load", help="Then ramp rollout concurrency 1, 2, 4, … until the app gives way "
                       "(mock policy unless --inference-url).")] = False,
    max_concurrency: Annotated[int, typer.Option(
        "--max-concurrency", min=1, max=1024, help="The --load ramp's last level.")] = 16,
    max_time: Annotated[float, typer.Option(
        "--max-time", min=0.1, metavar="SECONDS",
        help="With --load: the rollout budget a level's p99 must stay under.")] = 300.0,
    json_output: JsonOption = False,
) -> None:
    """Verify a task app at a URL and explain faults.

    Reachability, TLS, auth enforcement, protocol shapes and, if asked, a rollout; with
    --load, the concurrency it sustains (exit 1 if not even one rollout at a time).
    """
    with handling_errors(json_output):
        seed_list = parse_seeds(seeds)
        if api_key and env_file:
            raise UsageError("pass either --api-key or --env-file, not both",
                             hint="--env-file reads ENVIRONMENT_API_KEY from the file")
        from synth_deploy.health import CheckOptions

        # Read only when something is taken from it: `check URL --api-key K` reads no file.
        env = resolve_env(env_file) if url is None or not api_key or load else None
        url = _url(url, env)
        key, source = _api_key(api_key, env)
        with ExitStack() as stack:
            asked = _rollout(stack, url, inference_url, model, quiet=json_output) \
                if rollout else None
            options = CheckOptions(seeds=seed_list, rollout=asked, timeout_s=timeout)
            report = _checked(url, key, options, source, wait)
        capacity = None
        if load and report.healthy:
            from synth_deploy.runs import LoadOptions

            capacity = _load(report.url, key, env, inference_url, model,
                             LoadOptions(max_concurrency=max_concurrency, budget_s=max_time),
                             quiet=json_output)
    _finish(report, capacity, json_output)


def _finish(report: Any, capacity: Any, json_output: bool) -> NoReturn:
    """The report (and the load ramp's), then the exit: 1 when not even one rollout at a
    time held, else the check's."""
    if json_output:
        print_json(report.to_dict() | ({"load": capacity.to_dict()} if capacity else {}))
    else:
        _render(report)
        if capacity is not None:
            _render_load(capacity)
    raise typer.Exit(1 if capacity is not None and not capacity.sustained
                     else report.exit_code)


def _checked(url: str, key: str | None, options: Any, source: Any, wait: float | None
             ) -> Any:
    """The check's report: one pass, or (``--wait``) passes until healthy or out of time."""
    from synth_deploy.health import check, wait_until_healthy

    if wait is None:
        return check(url, key, options, key_source=source)
    return wait_until_healthy(url, key, options, key_source=source, timeout_s=wait,
                              on_attempt=_progress(url, wait))


def _rollout(stack: ExitStack, url: str, inference_url: str | None, model: str | None, *,
             quiet: bool) -> Any:
    """The rollout to check: through ``--inference-url``, else through the built-in mock
    policy, served here until ``stack`` closes (as `--load` and `smoke` serve it)."""
    from synth_deploy.health import RolloutOptions

    if inference_url:
        return RolloutOptions(inference_url, model)
    from synth_deploy.runs import serve_mock_policy
    from synth_deploy.urls import is_loopback

    policy, _ = serve_mock_policy(stack)
    if not quiet:
        reach = "" if is_loopback(url) else (
            "; an app on another machine cannot reach it: pass --inference-url and --model")
        console(stderr=True).print(f"[dim]rollout policy: built-in mock at "
                                   f"{escape(policy.inference_url)}{reach}[/dim]")
    return RolloutOptions(policy.inference_url, policy.model)


def _load(url: str, key: str | None, env: Any, inference_url: str | None, model: str | None,
          options: Any, *, quiet: bool) -> Any:
    """The capacity ramp (`synth_deploy.runs.probe_capacity`) against the checked URL."""
    from synth_deploy.env import ENVIRONMENT_API_KEY, Env
    from synth_deploy.runs import open_target, policy_target, probe_capacity

    run_env = Env({**env.values, ENVIRONMENT_API_KEY: key or ""}, dict(env.sources))
    err = console(stderr=True)

    def level_started(concurrency: int, rollouts: int) -> None:
        if not quiet:
            err.print(f"[dim]load: {concurrency} concurrent, {rollouts} rollouts…[/dim]")

    with open_target(url, run_env, policy=policy_target(inference_url, model, run_env)
                     ) as target:
        return probe_capacity(target, options, on_level_start=level_started)


def _render_load(capacity: Any) -> None:
    from rich.text import Text

    out = console()
    for note in capacity.notes:
        out.print(Text(note, style="dim"))
    out.print(load_table(capacity.to_dict()["levels"], width=min(out.width, 100)))
    stopped, knee, rec = capacity.stopped_by, capacity.knee, capacity.recommend()
    if stopped is not None:
        out.print(Text(f"gave way at {stopped.concurrency}: {stopped.problem}", style="red"))
    if knee is None:
        out.print(Text("sustained 0: fails even one rollout at a time", style="bold red"))
        return
    out.print(f"sustained {capacity.sustained} concurrent rollouts; knee at "
              f"{knee.concurrency} ({knee.rate}) → "
              f"max_concurrent_rollouts ≤ {rec['max_concurrent_rollouts']}, Modal "
              f"concurrent_inputs = {rec['concurrent_inputs']}")


def _url(url: str | None, env: Any) -> str:
    """The URL argument, else TASK_APP_URL (written by `tunnel` and `deploy`)."""
    if url is not None:
        return url
    from synth_deploy.env import TASK_APP_URL

    given = env.get(TASK_APP_URL)
    if not given:
        raise UsageError(f"no URL to check: none given and {TASK_APP_URL} is not set",
                         hint="pass the task app's URL, e.g. synth-deploy check "
                              "http://127.0.0.1:8001, or set TASK_APP_URL (`synth-deploy "
                              "tunnel` and `synth-deploy deploy` write it to .env)")
    return given


def _api_key(api_key: str | None, env: Any) -> tuple[str | None, str | None]:
    """The key to check with and where it came from (said in the report, never the key)."""
    if api_key:
        return api_key, "--api-key"
    from synth_deploy.env import ENVIRONMENT_API_KEY

    key = env.get(ENVIRONMENT_API_KEY)
    if key is None:
        return None, None
    source = env.source(ENVIRONMENT_API_KEY)
    where = "the environment" if source == "environment" else source
    return key, f"{ENVIRONMENT_API_KEY} from {where}"


def _progress(url: str, wait: float):
    started = time.monotonic()
    err = console(stderr=True)

    def on_attempt(attempt: int, report: Any) -> None:
        elapsed = time.monotonic() - started
        state = "[green]healthy[/green]" if report.healthy else escape(report.summary())
        err.print(f"[dim]waiting for {escape(redact_userinfo(url))}:[/dim] attempt {attempt}, "
                  f"{elapsed:.1f}s of {wait:g}s — {state}", markup=True, highlight=False)

    return on_attempt


def _render(report: Any) -> None:
    from rich.table import Table
    from rich.text import Text

    out = console()
    table = Table(title=f"synth-deploy check {redact_userinfo(report.url)}", title_justify="left",
                  show_lines=False, expand=False)
    table.add_column("check", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    table.add_column("latency", justify="right", no_wrap=True)
    table.add_column("actual (expected)", overflow="fold")
    for result in report.checks:
        table.add_row(*_result_row(result))
    out.print(table)
    for result in report.checks:
        if result.hint and result.verdict in ("fail", "warn"):
            label, style = _STYLES[result.verdict]
            line = Text(f"{label.split()[0]} {result.name}: ", style=style)
            line.append(result.hint)
            out.print(line, soft_wrap=True)  # whole: a fix is copied, never cut
    _render_footer(out, report)


def _result_row(result: Any) -> tuple[Any, ...]:
    """A check's row: name, verdict, latency, what was seen (and, failed, what was
    expected)."""
    from rich.text import Text

    label, style = _STYLES[result.verdict]
    cell = Text(result.actual, style="dim" if result.verdict == "skip" else "")
    if result.verdict in ("fail", "warn") and result.expected:
        cell.append(f"\nexpected: {result.expected}", style="dim")
    latency = "" if result.latency_ms is None else f"{result.latency_ms:.0f} ms"
    return result.name, Text(label, style=style), latency, cell


def _render_footer(out: Any, report: Any) -> None:
    """The key in use, where traces go, the app's code, then the verdict and exit code."""
    from rich.text import Text

    key = (f"key: {report.key_source}, sha256:{report.key_fingerprint}"
           if report.key_fingerprint else "key: none (pass --api-key or set ENVIRONMENT_API_KEY)")
    out.print(Text(key, style="dim"))
    if (traces := report.traces_line()) is not None:
        out.print(Text(traces, style="dim"), soft_wrap=True)
    if (identity := report.identity_line()) is not None:
        out.print(Text(identity, style="dim"), soft_wrap=True)
    verdict = Text("healthy" if report.healthy else "unhealthy",
                   style="bold green" if report.healthy else "bold red")
    took = (f"{report.duration_ms / 1000:.1f} s, {report.attempts} attempts"
            if report.attempts > 1 else f"{report.duration_ms:.0f} ms")
    verdict.append(f" ({took}, exit {report.exit_code})", style="dim")
    out.print(verdict)


__all__ = ["check_command", "register"]
