"""Timestamps as the trace tables hold them: the sortable UTC text synth-ai's SQLAlchemy
DATETIME columns use (``2025-01-31 12:00:00.000000``), read back as epoch seconds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

_EPOCH = datetime(1970, 1, 1)


def iso(ts: float | None) -> str | None:
    """Epoch seconds → the sortable UTC text SQLAlchemy's DATETIME used in synth-ai."""
    if ts is None:
        return None
    # What datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S.%f") writes, with
    # the same rounding, without strftime's formatting (a session has a dozen timestamps).
    return (_EPOCH + timedelta(seconds=ts)).isoformat(" ", "microseconds")


def epoch(text: Any) -> float | None:
    if text is None:
        return None
    if isinstance(text, int | float):
        return float(text)
    try:
        parsed = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


__all__ = ["epoch", "iso"]
