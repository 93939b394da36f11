"""Timestamps as the trace tables hold them: the sortable UTC text synth-ai's SQLAlchemy
DATETIME columns use (``2025-01-31 12:00:00.000000``), read back as epoch seconds.

A time leaves the store in one form, whoever reads it (`traces ls --json`, the viewer, a
stored rollout's record) and whether it was read from the store or is live: ISO 8601 with
its zone, ``2025-01-31T12:00:00.000000+00:00`` (`utc_text`, `zoned`)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

_EPOCH = datetime(1970, 1, 1)
# The last whole second formatted: a session's timestamps, and a batch's, share seconds.
# One tuple, replaced whole, so that threads never read a second with another's text.
_last_second: tuple[float, str] = (math.nan, "")


def iso(ts: float | None) -> str | None:
    """Epoch seconds → the sortable UTC text SQLAlchemy's DATETIME used in synth-ai."""
    if ts is None:
        return None
    # What datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S.%f") writes, with
    # timedelta's rounding (the fraction's microseconds, half to even), the date and time
    # of the whole second formatted once for every timestamp in it.
    global _last_second
    fraction, whole = math.modf(ts)
    micros = round(fraction * 1e6)
    if fraction < 0 or micros == 1_000_000:  # before 1970, or rounded up to the next second
        return (_EPOCH + timedelta(seconds=ts)).isoformat(" ", "microseconds")
    second = _last_second
    if second[0] != whole:
        second = _last_second = (whole, (_EPOCH + timedelta(seconds=whole)).isoformat(" "))
    return f"{second[1]}.{micros:06d}"


def utc_text(ts: float) -> str:
    """Epoch seconds → ISO 8601 with its zone: the one form a time is given in."""
    return datetime.fromtimestamp(ts, UTC).isoformat()


def zoned(text: Any) -> str | None:
    """A time as a store holds it (synth-ai's UTC text without a zone, or any ISO 8601
    form) → `utc_text`'s form; text that is no time is given as stored."""
    if text is None:
        return None
    if isinstance(text, int | float):
        return utc_text(text)
    try:
        parsed = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return str(text)
    return (parsed.astimezone(UTC) if parsed.tzinfo else parsed.replace(tzinfo=UTC)).isoformat()


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


__all__ = ["epoch", "iso", "utc_text", "zoned"]
