"""`LiveExporter`: a served app's rollouts as spans, sent as they finish, in the background.

The server hands each finished session to `offer`, which only puts it on a bounded queue
and returns: no span is made and nothing is sent on the request's path. One daemon thread
turns queued sessions into spans and sends them in batches. A receiver that is slow or down
costs rollouts nothing: after a failed batch the thread leaves it alone (1 s, doubling to
30 s), then tries it with a single session rather than a batch; the queue fills, further
sessions are dropped and counted (`LiveExportStats`), and a warning says so at most once a
minute. `close` gives what is queued a bounded time to go out, then stops.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from synth_deploy._batches import take_batch
from synth_deploy.otel._setting import OtlpSetting
from synth_deploy.tracing import SessionTrace

logger = logging.getLogger("synth_deploy.otel")
BATCH_SESSIONS = 64
MIN_PAUSE_S, MAX_PAUSE_S = 1.0, 30.0
WARN_EVERY_S = 60.0
_STOP = object()


@dataclass(frozen=True)
class LiveExportStats:
    """What a `LiveExporter` did: sessions and spans sent, dropped (the queue was full) and
    failed (the receiver did not take them)."""

    sent_sessions: int = 0
    sent_spans: int = 0
    dropped_sessions: int = 0
    dropped_spans: int = 0
    failed_sessions: int = 0
    failed_spans: int = 0
    sampled_out: int = 0  # rollouts not sent on purpose (OTEL_TRACES_SAMPLER)
    queued: int = 0

    def to_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class LiveExporter:
    """Sends offered sessions to ``setting``'s endpoint from one background thread.

    ``exporter``: any OpenTelemetry `SpanExporter` (default: OTLP/HTTP to the endpoint).
    """

    def __init__(self, setting: OtlpSetting, *, exporter: Any = None) -> None:
        from synth_deploy.otel._ids import session_trace_id
        from synth_deploy.otel._spans import SpanMaker, span_count

        self.setting = setting
        # As OTel's TraceIdRatioBased sampler decides: the trace id's low 64 bits under a bound.
        self._bound = round(setting.sample_ratio * (1 << 64))
        self._trace_id = session_trace_id
        self._span_count = span_count
        self._maker = SpanMaker(service_name=setting.service_name,
                                capture_content=setting.capture_content)
        if exporter is None:
            from synth_deploy.otel._export import otlp_exporter

            exporter = otlp_exporter(setting)
        self._exporter = exporter
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max(1, setting.queue_sessions))
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(("sent_sessions", "sent_spans", "dropped_sessions",
                                      "dropped_spans", "failed_sessions", "failed_spans",
                                      "sampled_out"), 0)
        self._warned_at = 0.0
        self._closed = False
        self._in_flight: list[SessionTrace] = []  # the batch being sent
        self._abandoned = False  # `close` gave up on the batch in flight: it is counted
        self._pause_s = 0.0  # after a failed batch: how long to leave the receiver alone
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="synth-deploy-otlp",
                                        daemon=True)
        self._thread.start()

    def offer(self, session: SessionTrace) -> None:
        """Queue ``session`` for sending; never blocks, never raises."""
        trace_id = self._trace_id
        if self._bound < (1 << 64) and \
                trace_id(session.session_id, session.metadata) & 0xFFFFFFFFFFFFFFFF \
                >= self._bound:
            self._count(sampled_out=1)
            return
        try:
            if self._closed:
                raise queue.Full
            self._queue.put_nowait(session)
        except queue.Full:
            self._count(dropped_sessions=1, dropped_spans=self._span_count(session))
            self._warn("queue full")

    def stats(self) -> LiveExportStats:
        with self._lock:
            return LiveExportStats(**self._counts, queued=self._queue.qsize())

    def close(self, timeout_s: float = 5.0) -> LiveExportStats:
        """Send what is queued within ``timeout_s``, then stop; what is left is dropped."""
        if not self._closed:
            self._closed = True
            self._stopping.set()  # cuts a pause after a failed batch short
            deadline = time.monotonic() + timeout_s
            try:
                self._queue.put(_STOP, timeout=timeout_s)
            except queue.Full:
                pass
            self._thread.join(max(deadline - time.monotonic(), 0.0))
            try:
                self._exporter.shutdown()  # cuts a retry wait short
            except Exception:  # noqa: BLE001 - stopping must not fail the server's shutdown
                logger.debug("OTLP exporter shutdown failed", exc_info=True)
            self._thread.join(1.0)
            with self._lock:
                if self._thread.is_alive():  # still waiting on the receiver: given up
                    self._abandoned = True
                    self._counts["dropped_sessions"] += len(self._in_flight)
                    self._counts["dropped_spans"] += sum(map(self._span_count,
                                                             self._in_flight))
            self._drop_queued()
        stats = self.stats()
        if stats.dropped_sessions or stats.failed_sessions:
            logger.warning("OTLP export to %s: %d rollouts sent, %d dropped (queue full or "
                           "stopped), %d not taken by the receiver", self.setting.display,
                           stats.sent_sessions, stats.dropped_sessions, stats.failed_sessions)
        return stats

    # -- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=1.0)
            except queue.Empty:
                if self._closed:  # `close` gave up on this thread and emptied the queue
                    return
                continue
            if first is _STOP:
                return
            # After a failure, one session tries the receiver: a down one costs one session
            # turned into spans per attempt, not a full batch.
            batch, stop = take_batch(self._queue, first, 1 if self._pause_s else BATCH_SESSIONS,
                                     _STOP)
            if self._send(batch):
                self._pause_s = 0.0
            elif not stop:
                # The receiver is down: wait before trying again (1, 2, 4... 30 s) and let
                # the queue fill meanwhile, so a down receiver costs no work per rollout.
                self._pause_s = min(max(self._pause_s * 2, MIN_PAUSE_S), MAX_PAUSE_S)
                self._stopping.wait(self._pause_s)
            if stop:
                return

    def _send(self, sessions: list[SessionTrace]) -> bool:
        """Send one batch; True when the receiver took it."""
        from opentelemetry.sdk.trace.export import SpanExportResult

        with self._lock:
            self._in_flight = sessions

        try:
            spans = [span for s in sessions for span in self._maker.spans(s)]
        except Exception:  # a session the mapping cannot read must not stop the thread
            logger.exception("could not turn %d session(s) into spans", len(sessions))
            self._count(failed_sessions=len(sessions))
            return True  # the receiver is not to blame
        from synth_deploy.otel._export import exporter_log

        with exporter_log() as said:  # one rate-limited warning instead of a line per retry
            try:
                ok = self._exporter.export(spans) is SpanExportResult.SUCCESS
            except Exception as exc:  # noqa: BLE001 - the receiver's failure is only counted
                said.append(f"{type(exc).__name__}: {exc}")
                ok = False
        if ok:
            self._count(sent_sessions=len(sessions), sent_spans=len(spans))
        else:
            self._count(failed_sessions=len(sessions), failed_spans=len(spans))
            self._warn("the receiver did not take a batch"
                       + (f" ({said[-1]})" if said else ""))
        return ok

    def _drop_queued(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not _STOP:
                self._count(dropped_sessions=1, dropped_spans=self._span_count(item))

    def _count(self, **deltas: int) -> None:
        with self._lock:
            if self._abandoned and not deltas.keys() & {"dropped_sessions", "sampled_out"}:
                return  # the batch `close` gave up on was counted as dropped then
            for name, delta in deltas.items():
                self._counts[name] += delta

    def _warn(self, why: str) -> None:
        if self._closed:  # `close` reports the totals once
            return
        now = time.monotonic()
        if now - self._warned_at < WARN_EVERY_S:
            return
        self._warned_at = now
        stats = self.stats()
        logger.warning("OTLP export to %s: %s; rollouts go on, their spans are dropped "
                       "(%d dropped, %d not taken so far)", self.setting.display, why,
                       stats.dropped_sessions, stats.failed_sessions)


__all__ = ["LiveExportStats", "LiveExporter"]
