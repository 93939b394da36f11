"""W3C trace context: the ``traceparent`` a rollout request came with, so that the rollout's
spans and its policy calls join the caller's trace (a trainer's, as NeMo Gym propagates it).

    traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
                 version-trace id (32 hex)-parent span id (16 hex)-flags

The engine reads the header where a request comes in and holds it for the work that request
runs (`incoming_trace_context`, a context variable: the rollout's task and what it awaits
see it, as OpenTelemetry's own context does). A `SessionTracer` made inside it keeps the
header in its session's metadata (``traceparent``): the store keeps it with the session, the
OTLP export makes it the parent of the rollout's spans, and `call_policy` sends it on,
naming the rollout's span as the parent. A header that is not valid trace context is
ignored, as the W3C recommendation says: the rollout starts a trace of its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

TRACEPARENT = "traceparent"  # the header, and the session metadata key that keeps it
_FORMAT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")


@dataclass(frozen=True)
class TraceParent:
    """A valid ``traceparent``: the caller's trace id, its span (our parent) and flags."""

    trace_id: str  # 32 lowercase hex digits, not all zero
    parent_id: str  # 16 lowercase hex digits, not all zero
    flags: str = "01"

    @classmethod
    def parse(cls, value: str | bytes | None) -> TraceParent | None:
        """The trace context in a header value, or None when it is not valid (W3C Trace
        Context, level 1: version ``ff`` is invalid, version ``00`` has exactly four
        fields, a later version may add fields after them)."""
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        if not value or len(value) > 512:
            return None
        found = _FORMAT.fullmatch(value.strip())
        if found is None:
            return None
        version, trace_id, parent_id, flags, rest = found.groups()
        if version == "ff" or (version == "00" and rest) or \
                trace_id == "0" * 32 or parent_id == "0" * 16:
            return None
        return cls(trace_id, parent_id, flags)

    def header(self) -> str:
        return f"00-{self.trace_id}-{self.parent_id}-{self.flags}"

    def child(self, span_id: int) -> str:
        """The ``traceparent`` to send on, from our span ``span_id`` in the same trace."""
        return f"00-{self.trace_id}-{span_id:016x}-{self.flags}"


_incoming: ContextVar[TraceParent | None] = ContextVar("synth_deploy_traceparent",
                                                       default=None)


@contextmanager
def incoming_trace_context(header: str | bytes | None) -> Iterator[TraceParent | None]:
    """Hold the trace context of ``header`` (None when absent or invalid) for what runs
    inside: the sessions traced there are its children."""
    parent = TraceParent.parse(header)
    token = _incoming.set(parent)
    try:
        yield parent
    finally:
        _incoming.reset(token)


def incoming_trace_parent() -> TraceParent | None:
    """The trace context the running request came with, if any."""
    return _incoming.get()


__all__ = ["TRACEPARENT", "TraceParent", "incoming_trace_context", "incoming_trace_parent"]
