"""What a run's traces say about its sandboxes: did they start, how long that took, what
their commands cost and which limits stopped them (`check` and `rehearse` report it)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SandboxSummary:
    """Sandboxes started (and how long each took to start), commands run (and their time),
    limits hit, by name."""

    started: int = 0
    start_ms: list[float] = field(default_factory=list)
    commands: int = 0
    command_s: float = 0.0
    limits: Counter[str] = field(default_factory=Counter)
    backends: set[str] = field(default_factory=set)
    # Sandboxes whose settings turned the network off on a machine that could not.
    network_open: int = 0

    @property
    def used(self) -> bool:
        return self.started > 0

    def describe(self) -> str:
        """One line: ``3 sandboxes started (local) in 41 ms median, 55 ms at most · 9
        commands, 1.20 s · limits hit: timeout ×1``."""
        ordered = sorted(self.start_ms)
        median = ordered[len(ordered) // 2] if ordered else 0.0
        line = (f"{self.started} sandbox{'es' if self.started != 1 else ''} started "
                f"({', '.join(sorted(self.backends)) or '?'}) in {median:.0f} ms median, "
                f"{max(ordered, default=0.0):.0f} ms at most · {self.commands} command"
                f"{'s' if self.commands != 1 else ''}, {self.command_s:.2f} s")
        if self.limits:
            line += " · limits hit: " + ", ".join(f"{name} ×{n}"
                                                  for name, n in sorted(self.limits.items()))
        if self.network_open:
            line += f" · network NOT blocked in {self.network_open} (asked off)"
        return line

    @property
    def hint(self) -> str | None:
        """The fix, when the sandboxes isolate less than their settings ask."""
        if not self.network_open:
            return None
        return ("this machine does not allow network namespaces, so the model's code can "
                "reach the network: serve as root, allow unprivileged user namespaces "
                "(a sysctl of your distribution), or deploy (Modal blocks it)")

    def to_dict(self) -> dict[str, Any]:
        return {"started": self.started, "start_ms": [round(x, 1) for x in self.start_ms],
                "commands": self.commands, "command_s": round(self.command_s, 6),
                "limits": dict(self.limits), "backends": sorted(self.backends),
                "network_open": self.network_open}


def summarize_traces(traces: Iterable[Mapping[str, Any] | None]) -> SandboxSummary:
    """The sandboxes of ``traces`` (v3 session dicts, as `/rollout` returns them)."""
    summary = SandboxSummary()
    for trace in traces:
        steps = trace.get("session_time_steps") if isinstance(trace, Mapping) else None
        for step in steps if isinstance(steps, list) else ():
            for event in step.get("events") or () if isinstance(step, Mapping) else ():
                if isinstance(event, Mapping) and event.get("system_instance_id") == "sandbox":
                    _add(summary, event)
    return summary


def _add(summary: SandboxSummary, event: Mapping[str, Any]) -> None:
    record = (event.get("metadata") or {}).get("sandbox")
    if not isinstance(record, Mapping):
        return
    latency = event.get("latency_ms")
    took = float(latency) if isinstance(latency, int | float) else 0.0
    if record.get("backend"):
        summary.backends.add(str(record["backend"]))
    if "created" in record:
        summary.started += 1
        summary.start_ms.append(took)
        created = record["created"] if isinstance(record["created"], Mapping) else {}
        if created.get("network") == "off" and str(record.get("network", "")).startswith(
                "NOT"):
            summary.network_open += 1
    elif "command" in record:
        summary.commands += 1
        summary.command_s += took / 1000.0
        if record.get("limit"):
            summary.limits[str(record["limit"])] += 1


__all__ = ["SandboxSummary", "summarize_traces"]
