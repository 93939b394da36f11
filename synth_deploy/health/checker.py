"""`check()` and `wait_until_healthy()`: probe a task app at a URL, step by step.

Order: url → dns → tcp → tls → root → health → auth → info → task_info → task_info_seeds →
rollout. A step that makes the later ones meaningless (nothing listens, Cloudflare cannot
reach the origin, the key is refused...) stops the run; the steps not run are listed as
``skip`` with the reason, so a report always shows what was and was not verified.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from synth_deploy.env import ENVIRONMENT_API_KEY, fingerprint, load_env, redact
from synth_deploy.errors import UsageError
from synth_deploy.health import probe
from synth_deploy.health.client import ProbeClient
from synth_deploy.health.endpoints import EndpointChecks, Stop
from synth_deploy.health.report import CheckResult, HealthReport

STEPS = ("url", "dns", "tcp", "tls", "root", "health", "auth", "info", "task_info",
         "task_info_seeds", "rollout")
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_SLOW_S = 2.0
DEFAULT_ROLLOUT_TIMEOUT_S = 120.0
USER_AGENT = "synth-deploy-check"


def check(
    url: str,
    api_key: str | None = None,
    *,
    seeds: Sequence[int] = (0,),
    rollout: bool = False,
    inference_url: str | None = None,
    model: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    key_source: str | None = None,
    slow_s: float = DEFAULT_SLOW_S,
    rollout_timeout_s: float = DEFAULT_ROLLOUT_TIMEOUT_S,
) -> HealthReport:
    """Check the task app at ``url`` and explain what is wrong; never raises for a sick app.

    ``api_key`` is sent as ``X-API-Key``; ``key_source`` says where it came from (shown with a
    fingerprint of the key, never the key). ``seeds`` are fetched from ``/task_info`` and
    validated as TaskInfo. With ``rollout=True`` one eval-mode rollout is run against
    ``inference_url``/``model``. ``timeout_s`` bounds every request (``rollout_timeout_s`` the
    rollout); answers slower than ``slow_s`` pass with a warning.

    Raises `UsageError` only for arguments that cannot work (``rollout`` without
    ``inference_url``, an empty seed list, a non-positive timeout).
    """
    if rollout and not inference_url:
        raise UsageError("a rollout check needs an inference URL",
                         hint="pass --inference-url (an OpenAI-compatible base URL) and --model")
    if not seeds:
        raise UsageError("no seeds to check", hint="pass at least one seed, e.g. --seeds 0")
    if timeout_s <= 0:
        raise UsageError(f"timeout must be positive, got {timeout_s:g}")
    started = time.perf_counter()
    report = HealthReport(url=(url or "").strip(), key_source=key_source if api_key else None,
                          key_fingerprint=fingerprint(api_key) if api_key else None)
    hidden: list[str] = [api_key] if api_key else []
    try:
        _run(report, api_key=api_key, key_source=key_source, hidden=hidden,
             seeds=[int(s) for s in seeds], timeout_s=timeout_s, slow_s=slow_s,
             rollout_timeout_s=rollout_timeout_s,
             rollout=(inference_url or "", model) if rollout else None)
    except Stop as stop:
        done = {c.name for c in report.checks}
        report.checks += [CheckResult(name, "skip", actual=f"not run: {stop.reason}")
                          for name in STEPS if name not in done]
    report.duration_ms = (time.perf_counter() - started) * 1000
    # Last line of defence: no check's text may carry a key that was sent.
    for result in report.checks:
        result.actual, result.expected = redact(result.actual, hidden), redact(result.expected,
                                                                               hidden)
        result.hint = redact(result.hint, hidden) if result.hint else result.hint
    return report


def wait_until_healthy(
    url: str,
    api_key: str | None = None,
    *,
    timeout_s: float,
    interval_s: float = 1.0,
    on_attempt: Callable[[int, HealthReport], None] | None = None,
    request_timeout_s: float = DEFAULT_TIMEOUT_S,
    **check_kwargs: Any,
) -> HealthReport:
    """Run `check()` until the app is healthy or ``timeout_s`` has passed; return the last report.

    For Modal cold starts and tunnel propagation. ``on_attempt(n, report)`` is called after
    each attempt (1-based), e.g. to print a progress line. Each request is bounded by
    ``request_timeout_s`` and by the time left. A URL that cannot work (exit code 2) is not
    retried. Check ``.healthy`` on the result: running out of time does not raise.
    """
    deadline = time.monotonic() + timeout_s
    attempt = 0
    while True:
        attempt += 1
        left = deadline - time.monotonic()
        report = check(url, api_key, timeout_s=max(0.2, min(request_timeout_s, left)),
                       **check_kwargs)
        if on_attempt is not None:
            on_attempt(attempt, report)
        left = deadline - time.monotonic()
        if report.healthy or report.exit_code == 2 or left <= 0:
            return report
        time.sleep(min(interval_s, left))




def resolve_api_key(api_key: str | None = None, env_files: Iterable[str | Path] = ()
                    ) -> tuple[str | None, str | None]:
    """The key to check with and where it came from (for the report, never the key itself).

    An explicit ``api_key`` wins; otherwise ENVIRONMENT_API_KEY from the env files, the
    process environment or ./.env (precedence as in `synth_deploy.env.load_env`).
    """
    if api_key:
        return api_key, "--api-key"
    env = load_env(env_files)
    key = env.get(ENVIRONMENT_API_KEY)
    if key is None:
        return None, None
    source = env.source(ENVIRONMENT_API_KEY)
    where = "the environment" if source == "environment" else source
    return key, f"{ENVIRONMENT_API_KEY} from {where}"


def _run(report: HealthReport, *, api_key: str | None, key_source: str | None,
         hidden: list[str], seeds: list[int], timeout_s: float, slow_s: float,
         rollout_timeout_s: float, rollout: tuple[str, str | None] | None) -> None:
    result, target = probe.check_url(report.url)
    report.checks.append(result)
    if target is None:
        raise Stop("the URL is unusable")
    report.url = target.base_url
    ssl_context = _ssl_context() if target.scheme == "https" else None
    _network(report, target, ssl_context, timeout_s)
    with ProbeClient(timeout_s=timeout_s, ssl_context=ssl_context,
                     user_agent=USER_AGENT) as client:
        steps = EndpointChecks(report, client, api_key=api_key, key_source=key_source,
                               seeds=seeds, timeout_s=timeout_s, slow_s=slow_s,
                               rollout_timeout_s=rollout_timeout_s)
        hidden.append(steps.wrong_key)
        steps.root()
        key_ok = steps.health()
        steps.auth()
        if not key_ok:
            raise Stop("needs a key the app accepts")
        steps.info()
        steps.task_info()
        steps.task_info_seeds()
        if rollout is not None:
            steps.rollout(*rollout)
        else:
            report.checks.append(CheckResult("rollout", "skip", actual="not asked (--rollout)"))


def _ssl_context() -> ssl.SSLContext:
    # certifi's bundle, as httpx uses: some Python builds ship without system CA certificates.
    try:
        import certifi
    except ImportError:
        return ssl.create_default_context()
    return ssl.create_default_context(cafile=certifi.where())


def _network(report: HealthReport, target: probe.Target, ssl_context: ssl.SSLContext | None,
             timeout_s: float) -> None:
    result, addrs = probe.resolve(target, timeout_s)
    report.checks.append(result)
    if result.verdict == "fail":
        raise Stop("the host does not resolve")
    result, sock = probe.connect(target, addrs, timeout_s)
    report.checks.append(result)
    if sock is None:
        raise Stop("no TCP connection")
    if ssl_context is None:
        sock.close()
        report.checks.append(CheckResult("tls", "skip", actual="not run: http:// URL"))
        return
    result = probe.handshake(target, sock, ssl_context, timeout_s)
    report.checks.append(result)
    if result.verdict == "fail":
        raise Stop("the TLS handshake failed")


__all__ = [
    "DEFAULT_SLOW_S",
    "DEFAULT_TIMEOUT_S",
    "STEPS",
    "check",
    "resolve_api_key",
    "wait_until_healthy",
]
