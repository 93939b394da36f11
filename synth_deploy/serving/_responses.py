"""JSON error bodies in the shape synth-ai's clients read: ``{"detail": {"error": {...}}}``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from starlette.responses import JSONResponse


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


__all__ = ["error_response", "validation_errors"]
