"""The ids of a session's spans, derived from the session: sending a session twice sends the
same spans. Light on purpose (no OpenTelemetry import): the policy call names the rollout's
span as the parent of what it asks for, in every served app, the ``otel`` extra or not."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from synth_deploy.tracing import TRACEPARENT, TraceParent


def trace_id_of(session_id: str) -> int:
    """The 128-bit trace id of a session that came with no trace context (never zero)."""
    return _id(f"trace/{session_id}", 16)


def span_id_of(session_id: str, *what: object) -> int:
    """The 64-bit id of the span that stands for ``what`` in a session (never zero)."""
    return _id("/".join(["span", session_id, *map(str, what)]), 8)


def rollout_span_id(session_id: str) -> int:
    """The id of a session's root span (``rollout {app}``)."""
    return span_id_of(session_id, "rollout")


def session_trace_parent(metadata: Any) -> TraceParent | None:
    """The trace context a stored session's rollout came with (its ``traceparent``)."""
    if not isinstance(metadata, Mapping):
        return None
    value = metadata.get(TRACEPARENT)
    return TraceParent.parse(value) if isinstance(value, str) else None


def session_trace_id(session_id: str, metadata: Any) -> int:
    """The trace a session's spans belong to: its caller's, else one of its own."""
    parent = session_trace_parent(metadata)
    return int(parent.trace_id, 16) if parent is not None else trace_id_of(session_id)


def _id(text: str, size: int) -> int:
    value = int.from_bytes(hashlib.sha256(text.encode()).digest()[:size], "big")
    return value or 1


__all__ = ["rollout_span_id", "session_trace_id", "session_trace_parent", "span_id_of",
           "trace_id_of"]
