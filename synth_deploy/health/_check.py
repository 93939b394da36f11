"""`check()` and `wait_until_healthy()`: probe a task app at a URL, step by step.

Order: url → dns → tcp → tls → root → health → auth → info → task_info → task_info_seeds →
rollout. A step that makes the later ones meaningless (nothing listens, Cloudflare cannot
reach the origin, the key is refused...) stops the run; the steps not run are listed as
``skip`` with the reason, so a report always shows what was and was not verified.
"""

from __future__ import annotations

import dataclasses
import ssl
import time
from collections.abc import Callable

from synth_deploy.env import fingerprint, redact, redact_userinfo
from synth_deploy.health import _network
from synth_deploy.health._endpoints import EndpointSteps, Stop
from synth_deploy.health._http import HTTPClient
from synth_deploy.health._options import CheckOptions
from synth_deploy.health._report import EXIT_BAD_URL, CheckResult, HealthReport
from synth_deploy.tls import stdlib_ssl_context

STEPS = ("url", "dns", "tcp", "tls", "root", "health", "auth", "info", "task_info",
         "task_info_seeds", "rollout")
USER_AGENT = "synth-deploy-check"


def check(url: str, api_key: str | None = None, options: CheckOptions | None = None, *,
          key_source: str | None = None) -> HealthReport:
    """Check the task app at ``url`` and explain what is wrong; never raises for a sick app.

    ``api_key`` is sent as ``X-API-Key``; ``key_source`` says where it came from (shown with a
    fingerprint of the key, never the key). ``options`` says which seeds to validate, whether
    to run a rollout, and the time limits (`CheckOptions()` when not given).
    """
    options = options or CheckOptions()
    started = time.perf_counter()
    report = HealthReport(url=(url or "").strip(), key_source=key_source if api_key else None,
                          key_fingerprint=fingerprint(api_key) if api_key else None)
    hidden: list[str] = [api_key] if api_key else []
    try:
        _run(report, api_key, key_source, options, hidden)
    except Stop as stop:
        done = {c.name for c in report.checks}
        report.checks += [CheckResult(name, "skip", actual=f"not run: {stop.reason}")
                          for name in STEPS if name not in done]
    report.duration_ms = (time.perf_counter() - started) * 1000
    # Last line of defence: no check's text may carry a key that was sent, or a URL's password.
    for result in report.checks:
        result.actual = redact_userinfo(redact(result.actual, hidden))
        result.expected = redact_userinfo(redact(result.expected, hidden))
        result.hint = redact_userinfo(redact(result.hint, hidden)) if result.hint else result.hint
    return report


def wait_until_healthy(
    url: str,
    api_key: str | None = None,
    options: CheckOptions | None = None,
    *,
    key_source: str | None = None,
    timeout_s: float,
    interval_s: float = 1.0,
    on_attempt: Callable[[int, HealthReport], None] | None = None,
) -> HealthReport:
    """Run `check()` until the app is healthy or ``timeout_s`` has passed; return the last report.

    For Modal cold starts and tunnel propagation. ``on_attempt(n, report)`` is called after
    each attempt (1-based), e.g. to print a progress line. Each request is bounded by
    ``options.timeout_s`` and by the time left. A URL that cannot work (exit code 2) is not
    retried. Check ``.healthy`` on the result: running out of time does not raise. The result's
    ``duration_ms`` is the whole wait and ``attempts`` the number of checks run.
    """
    options = options or CheckOptions()
    started = time.perf_counter()
    deadline = time.monotonic() + timeout_s
    attempt = 0
    while True:
        attempt += 1
        left = deadline - time.monotonic()
        bounded = dataclasses.replace(options, timeout_s=max(0.2, min(options.timeout_s, left)))
        report = check(url, api_key, bounded, key_source=key_source)
        report.attempts = attempt
        if on_attempt is not None:
            on_attempt(attempt, report)
        left = deadline - time.monotonic()
        if report.healthy or report.exit_code == EXIT_BAD_URL or left <= 0:
            report.duration_ms = (time.perf_counter() - started) * 1000
            return report
        time.sleep(min(interval_s, left))


def _run(report: HealthReport, api_key: str | None, key_source: str | None,
         options: CheckOptions, hidden: list[str]) -> None:
    result, target = _network.check_url(report.url)
    report.checks.append(result)
    if target is None:
        raise Stop("the URL is unusable")
    report.url = target.base_url
    ssl_context = stdlib_ssl_context() if target.scheme == "https" else None
    _below_http(report, target, ssl_context, options.timeout_s)
    with HTTPClient(timeout_s=options.timeout_s, ssl_context=ssl_context,
                    user_agent=USER_AGENT) as client:
        steps = EndpointSteps(report, client, options, api_key=api_key, key_source=key_source)
        hidden.append(steps.wrong_key)
        steps.root()
        key_ok = steps.health()
        steps.auth()
        if not key_ok:
            raise Stop("needs a key the app accepts")
        steps.info()
        steps.task_info()
        steps.task_info_seeds()
        if options.rollout is not None:
            steps.rollout(options.rollout)
            steps.recount_traces()  # the check's own rollout is a session too
        else:
            report.checks.append(CheckResult("rollout", "skip", actual="not asked (--rollout)"))


def _below_http(report: HealthReport, target: _network.Target,
                ssl_context: ssl.SSLContext | None, timeout_s: float) -> None:
    """DNS, TCP and TLS, each stopping the run when it fails."""
    result, addrs = _network.resolve(target, timeout_s)
    report.checks.append(result)
    if result.verdict == "fail":
        raise Stop("the host does not resolve")
    result, sock = _network.connect(target, addrs, timeout_s)
    report.checks.append(result)
    if sock is None:
        raise Stop("no TCP connection")
    if ssl_context is None:
        sock.close()
        report.checks.append(CheckResult("tls", "skip", actual="not run: http:// URL"))
        return
    result = _network.handshake(target, sock, ssl_context, timeout_s)
    report.checks.append(result)
    if result.verdict == "fail":
        raise Stop("the TLS handshake failed")


__all__ = ["STEPS", "check", "wait_until_healthy"]
