"""A rollout's events in synth-containers' envelope (``synth.trace-stream-event.v1``).

Each event is ``{schema, kind, ts, control, payload, digest, digest_schema, sequence,
event_id}`` plus ``rollout_id``, ``run_id`` and ``lane``, as synth-containers' reference app
serves them on ``/events`` and ``/stream``. ``digest`` follows the contract's byte-exact
``synth.envelope-digest.v2`` (a tagged, length-delimited encoding of kind, sequence and
payload, hashed with SHA-256 and cut to 16 hex digits), so a client that checks envelopes
checks ours.
"""

from __future__ import annotations

import hashlib
import math
import struct
from datetime import UTC, datetime
from typing import Any

SCHEMA = "synth.trace-stream-event.v1"
DIGEST_SCHEMA = "synth.envelope-digest.v2"
STREAM_SCHEMA = "synth.rollout.stream.v1"


def envelope(rollout_id: str, kind: str, sequence: int, payload: dict[str, Any],
             ts: str | None = None) -> dict[str, Any]:
    """One sequenced event of ``rollout_id`` (``payload``: JSON values only), its digest
    left for `sealed` to add when it is read: most rollouts' events never are."""
    return {"schema": SCHEMA, "kind": kind,
            "ts": ts or datetime.now(UTC).isoformat(timespec="microseconds").replace(
                "+00:00", "Z"),
            "control": False, "payload": payload, "sequence": sequence, "event_id": sequence,
            "rollout_id": rollout_id, "run_id": rollout_id, "lane": rollout_id}


def sealed(event: dict[str, Any]) -> dict[str, Any]:
    """``event`` with its digest (added once, in place) as the contract serves it."""
    if "digest" not in event:
        event["digest"] = envelope_digest(event["kind"], event["sequence"], event["payload"])
        event["digest_schema"] = DIGEST_SCHEMA
    return event


def envelope_digest(kind: str, sequence: int | None, payload: dict[str, Any]) -> str:
    """The contract's digest of an envelope (``synth.envelope-digest.v2``)."""
    out = bytearray(DIGEST_SCHEMA.encode() + b"\0")
    _encode({"kind": kind, "sequence": sequence, "payload": payload}, out)
    return hashlib.sha256(out).hexdigest()[:16]


def _encode(value: Any, out: bytearray) -> None:
    # Tags: n null, f/t booleans, i integer, d float (IEEE-754 bits), s string (byte length),
    # a array, o object (keys sorted by their UTF-8 bytes).
    if value is None:
        out += b"n"
    elif value is True or value is False:
        out += b"t" if value else b"f"
    elif isinstance(value, int):
        out += b"i%d;" % value
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("an event's payload holds only finite numbers")
        out += b"d" + struct.pack("!d", value).hex().encode() + b";"
    elif isinstance(value, str):
        encoded = value.encode()
        out += b"s%d:" % len(encoded) + encoded
    elif isinstance(value, list | tuple):
        out += b"a%d[" % len(value)
        for item in value:
            _encode(item, out)
        out += b"]"
    elif isinstance(value, dict):
        keys = sorted(value, key=lambda key: key.encode())
        out += b"o%d{" % len(keys)
        for key in keys:
            _encode(key, out)
            _encode(value[key], out)
        out += b"}"
    else:
        raise TypeError(f"an event's payload holds JSON values only, not "
                        f"{type(value).__name__}")


def stream_descriptor(rollout_id: str, transport: str = "sse",
                      retention: str = "run") -> dict[str, Any]:
    """Where a prepared (or telemetry-enabled) rollout's events are read, as the contract
    describes a stream (paths relative to the contract's base URL)."""
    base = f"/rollouts/{rollout_id}"
    return {"schema": STREAM_SCHEMA, "id": f"stream:{rollout_id}",
            "transports": {"poll": {"url": base + "/events"},
                           "sse": {"url": base + "/stream"} if transport == "sse" else None,
                           "websocket": None},
            "cursor": {"kind": "sequence", "producer_kind": None},
            "reward": {"url": base + "/reward"},
            "auth": {"mode": "api_key"}, "retention": retention,
            "reconnect": {"min_backoff_s": 1.0, "max_backoff_s": 30.0, "jitter": 0.2}}


__all__ = ["DIGEST_SCHEMA", "SCHEMA", "envelope", "envelope_digest", "sealed",
           "stream_descriptor"]
