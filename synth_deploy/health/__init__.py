"""Hosted health checks: probe a task app at any URL and explain exactly what is wrong.

    from synth_deploy.health import check, wait_until_healthy

    report = check("https://my-app.modal.run", api_key, seeds=range(5))
    if not report.healthy:
        print(report.failure.actual, report.failure.hint)

`serve`, `tunnel` and `deploy` use `wait_until_healthy` to decide that an app is ready.
The JSON shape of a report is documented in `synth_deploy.health.report`.
"""

from synth_deploy.health.checker import (
    DEFAULT_SLOW_S,
    DEFAULT_TIMEOUT_S,
    STEPS,
    check,
    resolve_api_key,
    wait_until_healthy,
)
from synth_deploy.health.report import (
    EXIT_BAD_URL,
    EXIT_HEALTHY,
    EXIT_UNHEALTHY,
    EXIT_UNREACHABLE,
    CheckResult,
    HealthReport,
    Verdict,
)

__all__ = [
    "DEFAULT_SLOW_S",
    "DEFAULT_TIMEOUT_S",
    "EXIT_BAD_URL",
    "EXIT_HEALTHY",
    "EXIT_UNHEALTHY",
    "EXIT_UNREACHABLE",
    "STEPS",
    "CheckResult",
    "HealthReport",
    "Verdict",
    "check",
    "resolve_api_key",
    "wait_until_healthy",
]
