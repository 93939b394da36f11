"""`HealthReport` and `CheckResult`: what `check()` found, for humans and machines.

A report is a list of checks run in order; each has a verdict:

- ``pass``: the app answered as the protocol requires;
- ``warn``: it works, but something deserves attention (slow answer, a key-prefix leak, a
  redirect, plain-text HTTP to a remote host);
- ``fail``: this is why the app is not usable; ``hint`` says how to fix it;
- ``skip``: not run, because an earlier failure makes it meaningless (or it was not asked for).

The app is healthy when no check failed. Exit codes: 0 healthy · 1 unhealthy · 2 the URL itself
is unusable (a usage error) · 3 unreachable (DNS, TCP connect or TLS failed).

JSON shape (`synth-deploy check --json`, ``HealthReport.to_dict()``)::

    {
      "url": "https://my-app.modal.run",     # the base URL checked (normalised)
      "healthy": true,                        # no check failed
      "exit_code": 0,                         # 0 healthy, 1 unhealthy, 2 bad URL, 3 unreachable
      "key": {"source": "ENVIRONMENT_API_KEY from .env",   # where the key came from, or null
              "fingerprint": "sha256:1a2b3c4d"},           # never the key; null when no key
      "duration_ms": 41.7,                    # whole check, wall clock (with --wait: the
                                              # whole wait, every attempt included)
      "attempts": 1,                          # checks run (more than 1 only with --wait)
      "failure": null | {...one check...},    # the first failed check
      "traces": {"enabled": true,             # what the app's /health says of its traces
                 "destination": "Modal Volume synth-math-traces: ...",  # null: unknown
                 "durable": true,             # outlives the machine that answered
                 "sessions": 12},             # stored by the container that answered
      "identity": {"version": "1",            # which code answers (its /health): the
                   "digest": "3f2a9c1d2e4b5a6f",  # declared version, the code's digest
                   "label": "1+3f2a9c1d2e4b5a6f"},  # (null: the app did not say)
      "checks": [
        {
          "name": "health",                   # url, dns, tcp, tls, root, health, auth, info,
                                              # task_info, task_info_seeds, rollout
          "verdict": "pass",                  # pass | warn | fail | skip
          "code": "ok",                       # machine-readable diagnosis, e.g. key_mismatch,
                                              # open_to_anyone, cloudflare_530, dns_unresolved,
                                              # connection_refused, timeout, tls_error,
                                              # schema_mismatch, wrong_base_url, slow, key_leak
          "expected": "200 with {\"healthy\": true}",
          "actual": "200 {\"healthy\": true, ...}",
          "latency_ms": 3.2,                  # null when nothing was sent
          "hint": null                        # the fix, one or two sentences
        }
      ]
    }

Nothing in a report contains a secret: keys appear only as fingerprints, and response bodies
are redacted before they are stored (synth-ai's leaked ``allowed_first15`` included).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from synth_deploy.env import redact_userinfo

Verdict = Literal["pass", "fail", "warn", "skip"]

EXIT_HEALTHY, EXIT_UNHEALTHY, EXIT_BAD_URL, EXIT_UNREACHABLE = 0, 1, 2, 3

# Diagnoses that mean "nothing answered at this address" rather than "the app answered wrong".
UNREACHABLE_CODES = frozenset({
    "dns_unresolved", "connection_refused", "connect_timeout", "connect_error", "tls_error",
})


@dataclass
class CheckResult:
    """One step of a health check: what was expected, what happened, and the fix."""

    name: str
    verdict: Verdict
    expected: str = ""
    actual: str = ""
    latency_ms: float | None = None
    hint: str | None = None
    code: str = "ok"

    @property
    def ok(self) -> bool:
        """True unless the verdict is ``fail``."""
        return self.verdict != "fail"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "verdict": self.verdict,
            "code": self.code,
            "expected": self.expected,
            "actual": self.actual,
            "latency_ms": None if self.latency_ms is None else round(self.latency_ms, 1),
            "hint": self.hint,
        }


@dataclass
class HealthReport:
    """Every check run against one URL, in order; see the module docstring for the JSON."""

    url: str
    checks: list[CheckResult] = field(default_factory=list)
    key_source: str | None = None
    key_fingerprint: str | None = None
    duration_ms: float = 0.0
    attempts: int = 1
    traces: dict[str, Any] | None = None  # /health's "tracing", when the app says it
    identity: dict[str, Any] | None = None  # /health's "identity": which code is served

    @property
    def healthy(self) -> bool:
        return bool(self.checks) and all(c.verdict != "fail" for c in self.checks)

    @property
    def failure(self) -> CheckResult | None:
        """The first failed check (the one to fix first), or None when healthy."""
        return next((c for c in self.checks if c.verdict == "fail"), None)

    @property
    def warnings(self) -> list[CheckResult]:
        return [c for c in self.checks if c.verdict == "warn"]

    @property
    def exit_code(self) -> int:
        failure = self.failure
        if failure is None:
            return EXIT_HEALTHY if self.checks else EXIT_UNHEALTHY
        if failure.name == "url":
            return EXIT_BAD_URL
        if failure.code in UNREACHABLE_CODES:
            return EXIT_UNREACHABLE
        return EXIT_UNHEALTHY

    def get(self, name: str) -> CheckResult | None:
        """The check called ``name``, if it ran."""
        return next((c for c in self.checks if c.name == name), None)

    def summary(self) -> str:
        """One line: "healthy" or the first failure and its actual value."""
        failure = self.failure
        if failure is None:
            warned = self.warnings
            return "healthy" + (f" ({len(warned)} warning{'s' * (len(warned) != 1)})"
                                if warned else "")
        return f"unhealthy: {failure.name}: {failure.actual}"

    def to_dict(self) -> dict[str, Any]:
        failure = self.failure
        return {
            "url": redact_userinfo(self.url),
            "healthy": self.healthy,
            "exit_code": self.exit_code,
            "key": {"source": self.key_source,
                    "fingerprint": (f"sha256:{self.key_fingerprint}"
                                    if self.key_fingerprint else None)},
            "duration_ms": round(self.duration_ms, 1),
            "attempts": self.attempts,
            "failure": failure.to_dict() if failure else None,
            "checks": [c.to_dict() for c in self.checks],
            "traces": self.traces,
            "identity": self.identity,
        }

    def identity_line(self) -> str | None:
        """Which code of the app answers, for humans (None when /health did not say)."""
        identity = self.identity
        if not identity or not (identity.get("digest") or identity.get("version")):
            return None
        return (f"code: version {identity.get('version') or '-'}, digest "
                f"{identity.get('digest') or '(none: the app has no file)'} (stored with "
                "every session; `traces ls --group identity`)")

    def traces_line(self) -> str | None:
        """Where the app's traces go, for humans (None when /health did not say)."""
        traces = self.traces
        if not traces:
            return None
        if not traces.get("enabled"):
            return "traces: not recorded by this app"
        where = traces.get("destination") or "a store the app did not name"
        return f"traces: {where} ({traces.get('sessions', 0)} sessions in this process)"


__all__ = [
    "EXIT_BAD_URL",
    "EXIT_HEALTHY",
    "EXIT_UNHEALTHY",
    "EXIT_UNREACHABLE",
    "UNREACHABLE_CODES",
    "CheckResult",
    "HealthReport",
    "Verdict",
]
