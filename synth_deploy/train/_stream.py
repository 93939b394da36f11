"""Following a job to its end: events, metrics and status, handed to a renderer.

`stream_job` polls ``events?since_seq=N&limit=200`` (paging until a short page, or one that
brings nothing new), the metrics and the job's status until the status is terminal or
``timeout_s`` passes. Renderers:
`CliHandler` (one line an event), `JsonHandler` (NDJSON on stdout), `ChartHandler` (a rich
Live panel with a loss sparkline).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO

from synth_deploy.train._backend import SUCCESS_STATUSES, TERMINAL_STATUSES, JobClient, JobKindPath

EXIT_JOB_SUCCEEDED, EXIT_JOB_FAILED, EXIT_POLL_TIMEOUT = 0, 1, 4
LOSS_NAMES = ("loss", "train.loss", "train_loss")
EVENTS_PAGE = 200


@dataclass
class JobOutcome:
    """Where a followed job ended: ``status`` terminal, or ``timed_out`` while still going."""

    job_id: str
    kind: JobKindPath
    status: str
    timed_out: bool = False
    job: dict[str, Any] = field(default_factory=dict)
    events_seen: int = 0

    @property
    def succeeded(self) -> bool:
        return self.status in SUCCESS_STATUSES

    @property
    def exit_code(self) -> int:
        """0 succeeded/completed · 1 failed/cancelled · 4 still running at the poll timeout."""
        if self.timed_out:
            return EXIT_POLL_TIMEOUT
        return EXIT_JOB_SUCCEEDED if self.succeeded else EXIT_JOB_FAILED

    def to_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "kind": self.kind, "status": self.status,
                "timed_out": self.timed_out, "exit_code": self.exit_code,
                "result": {k: v for k, v in self.job.items()
                           if k in ("final_reward", "model_id", "checkpoints", "error",
                                    "final_loss", "fine_tuned_model")}}


class StreamHandler(Protocol):
    wants_metrics: bool

    def on_event(self, event: dict[str, Any]) -> None: ...
    def on_metrics(self, points: list[dict[str, Any]]) -> None: ...
    def on_status(self, status: str, job: dict[str, Any]) -> None: ...
    def close(self, outcome: JobOutcome | None) -> None: ...


def _status_of(job: dict[str, Any]) -> str:
    return str(job.get("status") or "unknown").lower()


def _seq_of(event: dict[str, Any]) -> int | None:
    try:
        return int(event["seq"])
    except (KeyError, TypeError, ValueError):
        return None


class _EventReader:
    """Pages through ``events?since_seq=``, handing each event to the handler once.

    Backends are not trusted to honour ``since_seq`` or to number events: a page that does not
    move ``since`` forward ends the draining, events without ``seq`` are recognised by their
    content, and the deadline is checked between pages.
    """

    def __init__(self, client: JobClient, kind: JobKindPath, job_id: str,
                 handler: StreamHandler) -> None:
        self.client, self.kind, self.job_id, self.handler = client, kind, job_id, handler
        self.since = 0
        self.seen = 0
        self._unnumbered: set[str] = set()

    def drain(self, expired: Callable[[], bool]) -> None:
        while True:
            events = self.client.get_events(self.kind, self.job_id, since_seq=self.since,
                                            limit=EVENTS_PAGE)
            before = self.since
            fresh = 0
            for event in events:
                if self._is_new(event):
                    fresh += 1
                    self.seen += 1
                    self.handler.on_event(event)
            if len(events) < EVENTS_PAGE or expired():
                return
            if self.since == before and not fresh:
                return  # a full page of nothing new: since_seq is being ignored

    def _is_new(self, event: dict[str, Any]) -> bool:
        seq = _seq_of(event)
        if seq is None:
            key = json.dumps(event, sort_keys=True, default=str)
            if key in self._unnumbered:
                return False
            self._unnumbered.add(key)
            return True
        if seq <= self.since:
            return False
        self.since = seq
        return True


def stream_job(client: JobClient, kind: JobKindPath, job_id: str, handler: StreamHandler, *,
               interval_s: float = 5.0, timeout_s: float = 3600.0,
               clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> JobOutcome:
    """Follow ``job_id`` until it is terminal or ``timeout_s`` passes; never raises on a
    failed job (the outcome says so), only on backend errors (JobError).

    The handler is closed with the outcome, or with ``None`` when following was cut short
    (a backend error, Ctrl+C): no outcome is invented for a job whose end was not seen.
    """
    deadline = clock() + timeout_s
    reader = _EventReader(client, kind, job_id, handler)
    metric_keys: set[tuple[str, Any]] = set()
    last_status = None
    outcome: JobOutcome | None = None
    try:
        while True:
            reader.drain(lambda: clock() >= deadline)
            if handler.wants_metrics:
                fresh = []
                for point in client.get_metrics(kind, job_id):
                    key = (str(point.get("name")), point.get("step"))
                    if key not in metric_keys:
                        metric_keys.add(key)
                        fresh.append(point)
                if fresh:
                    handler.on_metrics(fresh)
            job = client.get_job(kind, job_id)
            status = _status_of(job)
            if status != last_status:
                handler.on_status(status, job)
                last_status = status
            if status in TERMINAL_STATUSES:
                # Events written between our last read and the terminal status still count.
                reader.drain(lambda: clock() >= deadline)
                outcome = JobOutcome(job_id, kind, status, job=job, events_seen=reader.seen)
                return outcome
            if clock() + interval_s > deadline:
                outcome = JobOutcome(job_id, kind, status, timed_out=True, job=job,
                                     events_seen=reader.seen)
                return outcome
            sleep(interval_s)
    finally:
        handler.close(outcome)


class JsonHandler:
    """NDJSON, one object a line, told apart by ``record``: ``event`` (the backend's event:
    seq, type, message, data, created_at), ``metric`` (name, step, value), ``status`` and,
    last, ``outcome`` (job_id, status, timed_out, exit_code, result). A stream cut short by an
    error or Ctrl+C has no ``outcome`` record; the CLI's error object follows instead."""

    wants_metrics = True

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout

    def _emit(self, obj: dict[str, Any]) -> None:
        self.out.write(json.dumps(obj, default=str) + "\n")
        self.out.flush()

    def on_event(self, event: dict[str, Any]) -> None:
        self._emit({"record": "event", **event})

    def on_metrics(self, points: list[dict[str, Any]]) -> None:
        for p in points:
            self._emit({"record": "metric", **p})

    def on_status(self, status: str, job: dict[str, Any]) -> None:
        self._emit({"record": "status", "status": status, "job_id": job.get("job_id")
                    or job.get("id")})

    def close(self, outcome: JobOutcome | None) -> None:
        if outcome is not None:
            self._emit({"record": "outcome", **outcome.to_dict()})


class CliHandler:
    """One line an event, for a human at a terminal (or a log file)."""

    wants_metrics = False

    def __init__(self, console: Any) -> None:
        self.console = console

    def on_event(self, event: dict[str, Any]) -> None:
        from rich.text import Text

        seq, etype = str(event.get("seq", "?")), str(event.get("type", "event"))
        message = str(event.get("message") or "")
        style = "red" if etype.endswith("failed") else (
            "green" if etype.endswith(("succeeded", "completed")) else "cyan")
        self.console.print(Text.assemble((f"{seq:>4}", "dim"), " ", (etype, style), " ",
                                         message), highlight=False)

    def on_metrics(self, points: list[dict[str, Any]]) -> None:  # never called: wants_metrics
        pass

    def on_status(self, status: str, job: dict[str, Any]) -> None:
        from rich.text import Text

        self.console.print(Text.assemble(("status:", "bold"), f" {status}"), highlight=False)

    def close(self, outcome: JobOutcome | None) -> None:
        pass


_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], width: int = 60) -> str:
    """A one-line plot of the last ``width`` values."""
    values = values[-width:]
    if not values:
        return ""
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    return "".join(_BARS[min(len(_BARS) - 1, int((v - lo) / span * (len(_BARS) - 1) + 0.5))]
                   for v in values)


class ChartHandler:
    """A rich Live panel: status, the last events and a loss sparkline from the metrics."""

    wants_metrics = True

    def __init__(self, console: Any, job_id: str = "") -> None:
        from rich.live import Live

        self.console = console
        self.job_id = job_id
        self.status = "pending"
        self.loss: list[tuple[Any, float]] = []
        self.recent: list[str] = []
        self.live = Live(self._render(), console=console, refresh_per_second=4, transient=False)
        self.live.start()

    def _render(self) -> Any:
        from rich.panel import Panel
        from rich.text import Text

        text = Text()
        text.append(f"job {self.job_id}  status: {self.status}\n", style="bold")
        if self.loss:
            values = [v for _s, v in self.loss]
            text.append(f"loss  {sparkline(values)}\n", style="magenta")
            text.append(f"      step {self.loss[-1][0]}: {values[-1]:.4f}  "
                        f"(min {min(values):.4f}, {len(values)} points)\n")
        else:
            text.append("loss  (no points yet)\n", style="dim")
        for line in self.recent[-5:]:
            text.append(line + "\n", style="dim")
        text.rstrip()
        return Panel(text, title="training", expand=False)

    def _refresh(self) -> None:
        self.live.update(self._render())

    def on_event(self, event: dict[str, Any]) -> None:
        self.recent.append(f"{event.get('seq', '?')} {event.get('type', '')} "
                           f"{event.get('message') or ''}".rstrip())
        self._refresh()

    def on_metrics(self, points: list[dict[str, Any]]) -> None:
        for p in points:
            if p.get("name") in LOSS_NAMES and isinstance(p.get("value"), (int, float)):
                self.loss.append((p.get("step"), float(p["value"])))
        self.loss.sort(key=lambda sv: (sv[0] is None, sv[0] if sv[0] is not None else 0))
        self._refresh()

    def on_status(self, status: str, job: dict[str, Any]) -> None:
        self.status = status
        self._refresh()

    def close(self, outcome: JobOutcome | None) -> None:
        self._refresh()
        self.live.stop()


__all__ = [
    "EXIT_JOB_FAILED",
    "EXIT_JOB_SUCCEEDED",
    "EXIT_POLL_TIMEOUT",
    "ChartHandler",
    "CliHandler",
    "JobOutcome",
    "JsonHandler",
    "StreamHandler",
    "sparkline",
    "stream_job",
]
