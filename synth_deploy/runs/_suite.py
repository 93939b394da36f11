"""Smoke and eval runs: open the target (an app id served here, or a URL), the policy (the
built-in mock unless a real one is given), run the seeds, and return a `RunReport`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from synth_deploy.env import ENVIRONMENT_API_KEY, Env, missing_key_hint
from synth_deploy.errors import AppNotFoundError, UsageError
from synth_deploy.runs._rollouts import (
    FailureStreak,
    PolicyTarget,
    RolloutOutcome,
    RunOptions,
    RunReport,
    admission_notes,
    path_notes,
    run_rollouts,
)
from synth_deploy.tls import client_ssl_context
from synth_deploy.urls import http_url, is_loopback, looks_like_url

if TYPE_CHECKING:
    from synth_deploy.tracing import TraceDbSetting

POLICY_API_KEY = "POLICY_API_KEY"


@dataclass
class RunTarget:
    """Where rollouts go and with which key and policy; ``local`` when we serve the app."""

    url: str
    api_key: str
    policy: PolicyTarget
    local: bool
    notes: list[str] = field(default_factory=list)
    trace_store: Any = None  # set for a remote app: its returned traces are stored here


def is_url(ref: str) -> bool:
    """True when ``ref`` is given as a URL (any scheme: the URL rule then judges it)."""
    return "://" in ref


@contextmanager
def _url_without_scheme_told(ref: str) -> Iterator[None]:
    """A ref that names no app but reads as a URL missing its scheme ("127.0.0.1:8001") gets
    the URL rule's error, as `check` gives it, instead of "no task app with id"."""
    try:
        yield
    except AppNotFoundError:
        if looks_like_url(ref):
            http_url(ref)  # raises: a URL without "://" has no scheme
        raise


def policy_target(inference_url: str | None, model: str | None, env: Env
                  ) -> PolicyTarget | None:
    """A real policy from ``--inference-url``/``--model`` (None: the built-in mock)."""
    if not inference_url:
        return None
    inference_url = http_url(inference_url, what="--inference-url")
    if not model:
        raise UsageError("--inference-url needs --model (the model name to request)")
    return PolicyTarget(inference_url, model, env.get(POLICY_API_KEY))


def default_seeds(app_or_url: str, split: str, env: Env) -> list[int]:
    """The default seeds a task app advertises for ``split`` (its registry, or its /info)."""
    datasets = _advertised_datasets(app_or_url, split, env)
    for dataset in datasets:
        seeds = (dataset.get("default_seeds") or {}).get(split)
        if seeds:
            return list(seeds)
    known = sorted({s for d in datasets for s in (d.get("default_seeds") or {})})
    raise UsageError(f"the app advertises no default seeds for split {split!r}",
                     hint=f"splits with seeds: {', '.join(known) or 'none'}; or pass --seeds")


def default_split(app_or_url: str, env: Env) -> tuple[str, list[int]] | None:
    """The split a task app declares as its default and that split's default seeds (None:
    it declares none with seeds): what `eval` runs when given neither --seeds nor --split."""
    for dataset in _advertised_datasets(app_or_url, None, env):
        split = dataset.get("default_split")
        seeds = (dataset.get("default_seeds") or {}).get(split) if split else None
        if seeds:
            return split, list(seeds)
    return None


def _advertised_datasets(app_or_url: str, split: str | None, env: Env) -> list[dict[str, Any]]:
    """The datasets a task app advertises: from its registry, or from its /info."""
    if is_url(app_or_url):
        import httpx

        app_or_url = http_url(app_or_url)
        try:
            info = httpx.get(app_or_url.rstrip("/") + "/info", timeout=15,
                             headers={"X-API-Key": env.get(ENVIRONMENT_API_KEY) or ""},
                             follow_redirects=True, verify=client_ssl_context()).json()
            return list(info["dataset"]["datasets"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            which = f"split {split!r}" if split else "the default split"
            raise UsageError(f"cannot read the default seeds of {which} from "
                             f"{app_or_url}/info: {type(exc).__name__}: {exc}",
                             hint="pass --seeds") from None
    from synth_deploy.taskapp.registry import load_app

    with _url_without_scheme_told(app_or_url):
        entry = load_app(app_or_url)
    return entry.build_config().dataset_registry.describe()


def run_suite(app_or_url: str, seeds: Sequence[int], env: Env, *,
              options: RunOptions = RunOptions(), policy: PolicyTarget | None = None,
              traces: TraceDbSetting | None = None,
              on_outcome: Callable[[RolloutOutcome], None] | None = None) -> RunReport:
    """`smoke` and `eval` as one call: open the target, run the seeds, close everything."""
    with open_target(app_or_url, env, policy=policy, traces=traces) as target:
        return run_seeds(target, seeds, options, on_outcome=on_outcome)


def serve_mock_policy(stack: ExitStack) -> tuple[PolicyTarget, Any]:
    """The built-in mock policy served on a free loopback port until ``stack`` closes: the
    target to send rollouts to, and its server. Every command that needs the mock starts it
    here."""
    from synth_deploy.runs._mock_policy import MOCK_MODEL, create_mock_policy_app
    from synth_deploy.serving import BackgroundServer

    server = stack.enter_context(BackgroundServer(create_mock_policy_app()))
    # It answers in vLLM's shape: a run through it exercises the token path as well.
    return PolicyTarget(server.url + "/v1", MOCK_MODEL, capture_tokens=True), server


@contextmanager
def open_target(app_or_url: str, env: Env, *, policy: PolicyTarget | None = None,
                traces: TraceDbSetting | None = None) -> Iterator[RunTarget]:
    """Serve the app (when given an id or path, with an ephemeral key) and the mock policy
    (when no policy is given); ``traces`` records every rollout either way."""
    notes: list[str] = []
    with ExitStack() as stack:
        if policy is None:
            policy, mock = serve_mock_policy(stack)
            notes.append(f"policy: built-in mock at {policy.inference_url}")
            mocked = True
        else:
            mocked = False

        if is_url(app_or_url):
            app_or_url = http_url(app_or_url)
            key = env.get(ENVIRONMENT_API_KEY)
            if not key:
                raise UsageError(
                    f"no {ENVIRONMENT_API_KEY} to call {app_or_url} with",
                    hint=missing_key_hint())
            if mocked and not is_loopback(app_or_url):
                notes.append("the mock policy listens on 127.0.0.1: a remote task app cannot "
                             "reach it; pass --inference-url and --model")
            store = None
            if traces is not None:
                from synth_deploy.tracing import open_trace_store

                store = open_trace_store(traces)
                stack.callback(store.close)
            yield RunTarget(app_or_url, key, policy, local=False, notes=notes,
                            trace_store=store)
            return

        from synth_deploy.serving import LocalRunner, ServeSettings

        with _url_without_scheme_told(app_or_url):
            runner = stack.enter_context(LocalRunner(ServeSettings.resolve(
                app_or_url, env, key_rule="ephemeral", traces=traces)))
        # Runs first on the way out: both servers begin stopping at once, then each is
        # waited for (one after the other they would take twice as long).
        stack.callback(runner.request_stop)
        if mocked:
            stack.callback(mock.request_stop)
        notes.append(f"task app {runner.entry.app_id!r} served at {runner.url} with an "
                     "ephemeral key")
        yield RunTarget(runner.url, runner.settings.keys.primary or "", policy, local=True,
                        notes=notes)


def run_seeds(target: RunTarget, seeds: Sequence[int], options: RunOptions = RunOptions(), *,
              on_outcome: Callable[[RolloutOutcome], None] | None = None) -> RunReport:
    """Run ``seeds`` against ``target`` and collect a report (blocking)."""
    from dataclasses import replace

    from synth_deploy.tunnel import concurrency_cap

    notes = list(target.notes)
    concurrency, capped = concurrency_cap(target.url, options.concurrency)
    if capped:
        notes.append(capped)
    options = replace(options, concurrency=concurrency)
    # A remote app's traces come back in the response and are stored here; a local app's
    # server stores them itself.
    store_here = target.trace_store is not None
    started = time.perf_counter()
    streak = FailureStreak(options.stop_after_failures)
    outcomes = asyncio.run(run_rollouts(target.url, target.api_key, seeds, target.policy,
                                        options, return_trace=store_here,
                                        on_outcome=on_outcome, streak=streak))
    elapsed = time.perf_counter() - started
    store_returned_traces(target, outcomes)
    stopped = None
    if streak.why is not None:
        left = len(seeds) - len(outcomes)
        stopped = f"{streak.why}; {plural_seeds(left)} not run"
    return RunReport(target.url, options.mode, concurrency, outcomes, elapsed,
                     notes + path_notes(outcomes) + admission_notes(outcomes),
                     stopped=stopped)


def plural_seeds(n: int) -> str:
    return f"{n} seed{'' if n == 1 else 's'}"


def store_returned_traces(target: RunTarget, outcomes: Sequence[RolloutOutcome]) -> None:
    """Store the traces a remote app returned (a local app's server stores its own).

    Any trace shape a synth-ai task app returns is read; one that cannot be read or stored
    becomes that rollout's ``warning``, never a lost run. A session the app's own server
    stored already (same database) is left as it is.
    """
    if target.trace_store is None:
        return
    from synth_deploy.errors import SynthDeployError
    from synth_deploy.tracing import session_from_trace

    for outcome in outcomes:
        if not outcome.trace:
            continue
        try:
            session = session_from_trace(outcome.trace, session_id=outcome.run_id)
            known = {"run_id": outcome.run_id, "seed": outcome.seed, "status": "ok",
                     "model": target.policy.model}
            if outcome.reward is not None:
                known["metrics"] = {"outcome_reward": outcome.reward}
            for key, value in known.items():
                session.metadata.setdefault(key, value)
            target.trace_store.write_session_sync(session)
        except SynthDeployError as exc:
            outcome.warn(f"its trace was not stored: {exc.message}")


__all__ = [
    "POLICY_API_KEY",
    "RunTarget",
    "default_seeds",
    "default_split",
    "is_url",
    "open_target",
    "policy_target",
    "run_seeds",
    "run_suite",
    "serve_mock_policy",
    "store_returned_traces",
]
