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

from synth_deploy.env import Env, mint_key
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
            key = env.get("ENVIRONMENT_API_KEY")
            if not key:
                raise UsageError(
                    f"no ENVIRONMENT_API_KEY to call {app_or_url} with",
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


__all__ = ["RunTarget", "is_url", "open_target", "run_seeds"]
