"""Smoke and eval runs: resolve the target (an app id served here, or a URL), the policy
(the built-in mock unless a real one is given), run the seeds, and return a `RunReport`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from synth_deploy.env import ENVIRONMENT_API_KEY, Env, applied_env, mint_key
from synth_deploy.errors import UsageError
from synth_deploy.jobs.rollouts import PolicyTarget, RolloutOutcome, RunReport, run_rollouts


@dataclass
class RunTarget:
    """Where rollouts go and with which key and policy; ``local`` when we serve the app."""

    url: str
    api_key: str
    policy: PolicyTarget
    local: bool
    notes: list[str] = field(default_factory=list)
    trace_store: Any = None


def is_url(ref: str) -> bool:
    return ref.startswith(("http://", "https://"))


def check_url(url: str) -> None:
    """A task app URL that httpx can use, or a UsageError that says what is wrong."""
    import httpx

    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise UsageError(f"{url!r} is not a usable URL: {exc}",
                         hint="write it as http(s)://HOST[:PORT]") from None
    if not parsed.host:
        raise UsageError(f"{url!r} has no host", hint="write it as http(s)://HOST[:PORT]")


def default_seeds(app_or_url: str, split: str, env: Env) -> list[int]:
    """The default seeds a task app advertises for ``split`` (its registry, or its /info)."""
    if is_url(app_or_url):
        import httpx

        check_url(app_or_url)
        try:
            info = httpx.get(app_or_url.rstrip("/") + "/info", timeout=15,
                             headers={"X-API-Key": env.get(ENVIRONMENT_API_KEY) or ""},
                             follow_redirects=True).json()
            datasets = info["dataset"]["datasets"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"cannot read the default seeds of split {split!r} from "
                             f"{app_or_url}/info: {type(exc).__name__}: {exc}",
                             hint="pass --seeds") from None
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


def run_suite(app_or_url: str, seeds: Sequence[int], env: Env, *, mode: str = "rl",
              concurrency: int = 8, inference_url: str | None = None,
              model: str | None = None, split: str | None = None, max_time_s: float = 300.0,
              trace_store: Any = None,
              on_outcome: Callable[[RolloutOutcome], None] | None = None) -> RunReport:
    """`smoke` and `eval` as one call: open the target, run the seeds, close everything."""
    with open_target(app_or_url, env, inference_url=inference_url, model=model,
                     trace_store=trace_store) as target:
        return run_seeds(target, seeds, mode=mode, concurrency=concurrency, split=split,
                         max_time_s=max_time_s, on_outcome=on_outcome)


@contextmanager
def open_target(app_or_url: str, env: Env, *, inference_url: str | None = None,
                model: str | None = None, trace_store: Any = None) -> Iterator[RunTarget]:
    """Serve the app (when given an id or path) and the mock policy (when no URL is given)."""
    from synth_deploy.taskapp.serving import BackgroundServer

    notes: list[str] = []
    with ExitStack() as stack:
        if inference_url:
            if not is_url(inference_url):
                raise UsageError(f"--inference-url must be an http(s) URL, got {inference_url!r}")
            if not model:
                raise UsageError("--inference-url needs --model (the model name to request)")
            policy = PolicyTarget(inference_url, model, env.get("POLICY_API_KEY"))
        else:
            from synth_deploy.jobs.mock_policy import MOCK_MODEL, create_mock_policy_app

            mock = stack.enter_context(BackgroundServer(create_mock_policy_app()))
            policy = PolicyTarget(mock.url + "/v1", model or MOCK_MODEL)
            notes.append(f"policy: built-in mock at {mock.url}/v1")

        if is_url(app_or_url):
            check_url(app_or_url)
            key = env.get(ENVIRONMENT_API_KEY)
            if not key:
                raise UsageError(
                    f"no {ENVIRONMENT_API_KEY} to call {app_or_url} with",
                    hint="set it in the environment or .env, or pass --env-file F")
            host = urlsplit(app_or_url).hostname or ""
            if not inference_url and host not in ("127.0.0.1", "localhost", "::1"):
                notes.append("the mock policy listens on 127.0.0.1: a remote task app cannot "
                             "reach it; pass --inference-url and --model")
            yield RunTarget(app_or_url.rstrip("/"), key, policy, local=False, notes=notes,
                            trace_store=trace_store)
            return

        from synth_deploy.taskapp.registry import load_app
        from synth_deploy.taskapp.server import create_app

        # The app reads vendor keys and settings from os.environ, as under `serve`.
        stack.enter_context(applied_env(env))
        config = load_app(app_or_url).build_config()
        keys = env.api_keys()
        if not keys:
            keys = [mint_key()]
            notes.append("no ENVIRONMENT_API_KEY configured: using an ephemeral key for this run")
        app = create_app(config, api_keys=keys, trace_store=trace_store)
        server = stack.enter_context(BackgroundServer(app))
        notes.append(f"task app {config.app_id!r} served at {server.url}")
        yield RunTarget(server.url, keys[0], policy, local=True, notes=notes,
                        trace_store=trace_store)


def run_seeds(
    target: RunTarget,
    seeds: Sequence[int],
    *,
    mode: str = "rl",
    concurrency: int = 8,
    split: str | None = None,
    max_time_s: float = 300.0,
    on_outcome: Callable[[RolloutOutcome], None] | None = None,
) -> RunReport:
    """Run ``seeds`` against ``target`` and collect a report (blocking)."""
    from synth_deploy.tunnel import concurrency_cap

    notes = list(target.notes)
    concurrency, capped = concurrency_cap(target.url, concurrency)
    if capped:
        notes.append(capped)
    # A remote app's traces come back in the response and are stored here; a local app's
    # server stores them itself.
    store_here = target.trace_store is not None and not target.local
    started = time.perf_counter()
    outcomes = asyncio.run(run_rollouts(
        target.url, target.api_key, seeds, target.policy, mode=mode, concurrency=concurrency,
        max_time_s=max_time_s, split=split, return_trace=store_here, on_outcome=on_outcome))
    elapsed = time.perf_counter() - started
    if store_here:
        from synth_deploy.tracing import SessionTrace

        for outcome in outcomes:
            if outcome.trace:
                target.trace_store.write_session_sync(SessionTrace.from_dict(outcome.trace))
    return RunReport(target.url, mode, concurrency, outcomes, elapsed, notes)


__all__ = [
    "RunTarget",
    "check_url",
    "default_seeds",
    "is_url",
    "open_target",
    "run_seeds",
    "run_suite",
]
