"""Hosted health checks: probe a task app at any URL and explain exactly what is wrong.

    from synth_deploy.health import CheckOptions, check, wait_until_healthy

    report = check("https://my-app.modal.run", api_key, CheckOptions(seeds=range(5)))
    if not report.healthy:
        print(report.failure.actual, report.failure.hint)

The caller resolves the key (the CLI: ``--api-key``, else ENVIRONMENT_API_KEY from the `Env`)
and says where it came from with ``key_source``; this package never reads the environment.
`deploy` and `tunnel` use `wait_until_healthy` / `check` to decide that an app is ready.
The JSON shape of a report (``HealthReport.to_dict()``, ``check --json``) is documented in
the docstring of ``synth_deploy/health/_report.py``.

Modules (private; import from here): ``_check`` runs the steps in order, ``_options`` holds
what to try, ``_network`` the steps below HTTP (url, dns, tcp, tls), ``_endpoints`` the HTTP
steps through ``_http``'s small client, ``_diagnosis`` turns symptoms into fixes, ``_schema``
validates answers against the wire models, ``_report`` holds the result.
"""

from synth_deploy.health._check import STEPS, check, wait_until_healthy
from synth_deploy.health._options import (
    DEFAULT_ROLLOUT_TIMEOUT_S,
    DEFAULT_SLOW_S,
    DEFAULT_TIMEOUT_S,
    CheckOptions,
    RolloutOptions,
)
from synth_deploy.health._report import (
    EXIT_BAD_URL,
    EXIT_HEALTHY,
    EXIT_UNHEALTHY,
    EXIT_UNREACHABLE,
    CheckResult,
    HealthReport,
    Verdict,
)

__all__ = [
    "DEFAULT_ROLLOUT_TIMEOUT_S",
    "DEFAULT_SLOW_S",
    "DEFAULT_TIMEOUT_S",
    "EXIT_BAD_URL",
    "EXIT_HEALTHY",
    "EXIT_UNHEALTHY",
    "EXIT_UNREACHABLE",
    "STEPS",
    "CheckOptions",
    "CheckResult",
    "HealthReport",
    "RolloutOptions",
    "Verdict",
    "check",
    "wait_until_healthy",
]
