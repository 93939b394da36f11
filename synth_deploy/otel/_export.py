"""`export_otlp`: stored rollouts → an OTLP/HTTP receiver, resumable.

Sessions are read one at a time through the store's public reads, turned into spans
(`SpanMaker`) and sent in batches with the OTLP/HTTP exporter of
``opentelemetry-exporter-otlp-proto-http``. What each destination (endpoint and the headers
that pick a tenant or experiment) has acknowledged is remembered in a small SQLite file
*beside* the trace database, never in it: read commands leave the trace database's bytes as
they are. Running the same export again sends only what is new; an interrupted one resumes
where it stopped. Sending a session twice is harmless anyway: its span ids are derived from
it, so a receiver keeps one copy.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from synth_deploy.errors import SynthDeployError, UsageError
from synth_deploy.otel._setting import OtlpSetting
from synth_deploy.tracing import SessionFilter, TraceStore, matching_session_ids

MAX_BATCH_SPANS = 512
_STATE_SUFFIX = ".otlp-sent"


class OtlpExportError(SynthDeployError):
    """The receiver did not take a batch (down, refusing, or answering an error)."""

    exit_code = 3


@dataclass(frozen=True)
class OtlpExportOptions:
    """Which sessions to send and how: ``where`` selects them (the viewer's filter; all by
    default), ``limit`` caps how many are sent now, ``state`` is where sent sessions are
    remembered (default: beside a local trace file) and ``resend`` sends every selected
    session again, sent or not."""

    where: SessionFilter = field(default_factory=SessionFilter)
    limit: int | None = None  # sessions
    state: Path | None = None
    resend: bool = False


@dataclass(frozen=True)
class OtlpExportResult:
    """What one export did."""

    endpoint: str
    matched: int  # sessions that passed the filters
    sent: int  # sessions sent now
    spans: int  # spans sent now
    already_sent: int  # sessions skipped: this destination had them
    seconds: float
    state: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


Progress = Callable[[int, int, int], None]  # (sessions done, sessions to send, spans sent)


def default_state_path(store: TraceStore) -> Path:
    """Beside a local trace file (``synth_ai.db`` → ``synth_ai.db.otlp-sent``); for a remote
    store, in the user's cache folder."""
    path = store.setting.path
    if not store.setting.is_remote and path is not None and str(path) != ":memory:":
        return path.with_name(path.name + _STATE_SUFFIX)
    return Path.home() / ".cache" / "synth-deploy" / f"remote-traces{_STATE_SUFFIX}"


class SentSessions:
    """The sessions each destination acknowledged, per trace store, in a SQLite file."""

    def __init__(self, path: Path, store_key: str, destination: str) -> None:
        self.path, self.store_key, self.destination = path, store_key, destination
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, timeout=10)
            self._db.execute("CREATE TABLE IF NOT EXISTS sent (store TEXT NOT NULL, "
                             "destination TEXT NOT NULL, session_id TEXT NOT NULL, "
                             "spans INTEGER, sent_at REAL, "
                             "PRIMARY KEY (store, destination, session_id))")
            self._db.commit()
        except (OSError, sqlite3.Error) as exc:
            raise UsageError(f"cannot keep the export state in {path}: {exc}",
                             hint="pass --state FILE in a writable folder") from None

    def sent(self) -> set[str]:
        rows = self._db.execute("SELECT session_id FROM sent WHERE store = ? AND "
                                "destination = ?", (self.store_key, self.destination))
        return {r[0] for r in rows}

    def record(self, sessions: list[tuple[str, int]]) -> None:
        now = time.time()
        self._db.executemany("INSERT OR REPLACE INTO sent VALUES (?, ?, ?, ?, ?)",
                             [(self.store_key, self.destination, sid, spans, now)
                              for sid, spans in sessions])
        self._db.commit()

    def close(self) -> None:
        self._db.close()


def export_otlp(store: TraceStore, setting: OtlpSetting,
                options: OtlpExportOptions = OtlpExportOptions(), *,
                on_progress: Progress | None = None, exporter: Any = None) -> OtlpExportResult:
    """Send the matching stored sessions to ``setting``'s endpoint as spans.

    ``exporter``: any OpenTelemetry `SpanExporter` (default: OTLP/HTTP to the endpoint).
    Raises `OtlpExportError` when the receiver refuses a batch: what was acknowledged before
    stays remembered, so running the export again resumes.
    """
    from synth_deploy.otel._spans import SpanMaker

    started = time.perf_counter()
    if options.limit is not None and options.limit < 1:
        raise UsageError(f"--limit must be at least 1, got {options.limit}")
    ids = matching_session_ids(store, options.where)  # oldest first
    state_path = options.state or default_state_path(store)
    sent_before = SentSessions(state_path, store.display, setting.destination())
    own_exporter = exporter is None
    try:
        done = set() if options.resend else sent_before.sent()
        todo = _unsent(ids, done, options.limit)
        exporter = exporter or otlp_exporter(setting)
        maker = SpanMaker(service_name=setting.service_name,
                          capture_content=setting.capture_content)
        sent, spans_sent = _send_all(store, todo, maker, exporter, setting, sent_before,
                                     on_progress)
    finally:
        sent_before.close()
        if own_exporter and exporter is not None:
            exporter.shutdown()
    return OtlpExportResult(endpoint=setting.display, matched=len(ids), sent=sent,
                            spans=spans_sent, already_sent=sum(i in done for i in ids),
                            seconds=time.perf_counter() - started, state=str(state_path))


def _unsent(ids: list[str], done: set[str], limit: int | None) -> list[str]:
    """The sessions still to send, oldest first, at most ``limit`` of them."""
    todo = [sid for sid in ids if sid not in done]
    return todo if limit is None else todo[:limit]


def _send_all(store: TraceStore, todo: list[str], maker: Any, exporter: Any,
              setting: OtlpSetting, sent_before: SentSessions, on_progress: Progress | None
              ) -> tuple[int, int]:
    """Each batch's spans sent, then remembered as sent (so a rerun resumes after the last
    batch the receiver took); returns the sessions and spans sent."""
    from synth_deploy.otel._spans import span_count

    sent = spans_sent = 0
    if on_progress is not None:
        on_progress(0, len(todo), 0)
    for batch in _batches(store, todo, span_count):
        spans = [span for session in batch for span in maker.spans(session)]
        _send(exporter, spans, setting)
        sent_before.record([(s.session_id, span_count(s)) for s in batch])
        sent += len(batch)
        spans_sent += len(spans)
        if on_progress is not None:
            on_progress(sent, len(todo), spans_sent)
    return sent, spans_sent


def _batches(store: TraceStore, ids: list[str], count: Callable[[Any], int]) -> Iterator[list]:
    """Sessions in batches of about `MAX_BATCH_SPANS` spans (a big session goes alone)."""
    batch: list[Any] = []
    size = 0
    for sid in ids:
        session = store.get_session(sid)
        spans = count(session)
        if batch and size + spans > MAX_BATCH_SPANS:
            yield batch
            batch, size = [], 0
        batch.append(session)
        size += spans
    if batch:
        yield batch


def otlp_exporter(setting: OtlpSetting) -> Any:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=setting.endpoint, headers=dict(setting.headers),
                            timeout=setting.timeout_s)


def _send(exporter: Any, spans: list[Any], setting: OtlpSetting) -> None:
    from opentelemetry.sdk.trace.export import SpanExportResult

    with exporter_log() as said:
        result = exporter.export(spans)
    if result is not SpanExportResult.SUCCESS:
        cause = said[-1] if said else "no answer"
        raise OtlpExportError(
            f"the OTLP receiver at {setting.display} did not take {len(spans)} span(s): "
            f"{cause}",
            hint="is the receiver up, and are --endpoint and --headers right? Run the same "
                 "command again to resume: sessions already sent are skipped")


class _PerThreadLog(logging.Handler):
    """Routes the exporter's log records to the thread that is capturing them (see
    `exporter_log`); records of other threads go on to the root logger as before."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.local = threading.local()

    def emit(self, record: logging.LogRecord) -> None:
        said = getattr(self.local, "said", None)
        if said is not None:
            said.append(record.getMessage())
        else:
            logging.getLogger().handle(record)


_ROUTER = _PerThreadLog()
_ROUTER_LOCK = threading.Lock()


@contextmanager
def exporter_log() -> Iterator[list[str]]:
    """The exporter's complaints in this thread, kept for an error message or a warning
    instead of printed as they come (with retries, a down receiver would otherwise print a
    line per attempt). Safe from several threads at once."""
    with _ROUTER_LOCK:
        logger = logging.getLogger("opentelemetry.exporter")
        if _ROUTER not in logger.handlers:
            logger.addHandler(_ROUTER)
            logger.propagate = False
    said: list[str] = []
    _ROUTER.local.said = said
    try:
        yield said
    finally:
        _ROUTER.local.said = None


__all__ = ["OtlpExportError", "OtlpExportOptions", "OtlpExportResult", "default_state_path",
           "export_otlp"]
