"""JSON error bodies in the shape synth-ai's clients read: ``{"detail": {"error": {...}}}``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import msgspec
from pydantic import ValidationError
from starlette.responses import JSONResponse

_ENCODE = msgspec.json.Encoder().encode


def encode_json(content: Any) -> bytes:
    """``content`` as compact JSON, rendered by msgspec, in C: a long episode's document is
    tens of MB, and `json.dumps` holds the event loop several times as long for it. The
    bytes are Starlette's for what JSON holds; NaN and the infinities go as null, as
    pydantic writes them (Starlette refuses them, a 500); content msgspec has no rule for
    (a dict keyed by booleans) is rendered by `json.dumps` as Starlette renders it."""
    try:
        return _ENCODE(content)
    except (TypeError, ValueError):
        return json.dumps(content, ensure_ascii=False, allow_nan=False,
                          separators=(",", ":")).encode()


class MsgspecJSONResponse(JSONResponse):
    """A `JSONResponse` rendered by `encode_json`."""

    def render(self, content: Any) -> bytes:
        return encode_json(content)


def error_response(status: int, code: str, message: str, *,
                   headers: Mapping[str, str] | None = None, **extra: Any) -> JSONResponse:
    """The error body shape used throughout synth-ai: {"detail": {"error": {...}}}."""
    return JSONResponse({"detail": {"error": {"code": code, "message": message, **extra}}},
                        status_code=status, headers=headers)


def validation_errors(exc: ValidationError) -> list[dict[str, str]]:
    """Pydantic errors as field paths ("env.seed") with messages; inputs are not echoed."""
    return [
        {"path": ".".join(str(p) for p in err["loc"]) or "(body)", "message": err["msg"],
         "type": err["type"]}
        for err in exc.errors(include_url=False, include_input=False)
    ]


__all__ = ["MsgspecJSONResponse", "encode_json", "error_response", "validation_errors"]
