"""`RehearsalReport`: what a rehearsal found, check by check, and whether to train.

Checks, in order: ``health`` (the app answers at all), ``training step``, ``reward signal``,
``determinism``, ``capacity``, ``timeouts``, ``idle connection``. Each has a verdict (pass,
warn, fail, skip), a one-line finding that leads with its number, the fix when there is one,
and its figures under ``data``. Exit codes: 0 ready to train (warnings allowed), 1 a problem
that would waste the run, 2 usage, 3 unreachable.

JSON shape (`synth-deploy rehearse --json`, ``RehearsalReport.to_dict()``)::

    {
      "target": "http://127.0.0.1:8001",     # the task app rehearsed against
      "ready": true, "exit_code": 0,
      "elapsed_s": 7.9,
      "plan": {...},                          # the training step as read from the config
      "checks": [{"name": "reward signal", "verdict": "pass",
                  "finding": "2 of 8 groups have zero reward variance", "fix": null,
                  "details": [...], "data": {...}}, ...],
      "notes": [...], "traces": "traces/v3/synth_ai.db (default)"
    }
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Verdict = Literal["pass", "warn", "fail", "skip"]
CHECKS = ("health", "training step", "reward signal", "token continuity", "sandboxes",
          "determinism", "capacity", "timeouts", "idle connection")


@dataclass
class RehearsalCheck:
    """One check's verdict, its headline finding, the fix, and the figures behind it."""

    name: str
    verdict: Verdict
    finding: str
    fix: str | None = None
    details: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "verdict": self.verdict, "finding": self.finding,
                "fix": self.fix, "details": self.details, "data": self.data}


@dataclass
class RehearsalReport:
    """Every check of one rehearsal, in order."""

    target: str
    plan: dict[str, Any]
    checks: list[RehearsalCheck] = field(default_factory=list)
    elapsed_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    traces: str | None = None

    def check(self, name: str) -> RehearsalCheck | None:
        return next((c for c in self.checks if c.name == name), None)

    @property
    def ready(self) -> bool:
        """No check failed: the run would not be wasted by anything rehearsed here."""
        return all(c.verdict != "fail" for c in self.checks)

    @property
    def exit_code(self) -> int:
        return 0 if self.ready else 1

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "ready": self.ready, "exit_code": self.exit_code,
                "elapsed_s": round(self.elapsed_s, 2), "plan": self.plan,
                "checks": [c.to_dict() for c in self.checks], "notes": self.notes,
                "traces": self.traces}


__all__ = ["CHECKS", "RehearsalCheck", "RehearsalReport", "Verdict"]
