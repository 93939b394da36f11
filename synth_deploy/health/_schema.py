"""Validating answers against the protocol's wire models, with field paths in the verdict."""

from __future__ import annotations

from typing import Any


def validate(model_name: str, data: Any) -> tuple[Any | None, dict[str, str] | None]:
    """Validate ``data`` as the contracts model ``model_name``.

    Returns ``(model, None)`` or ``(None, problem)`` where problem has ``path`` (dotted field
    path), ``expected``, ``actual`` and ``more`` (how many other fields also failed).
    """
    from pydantic import ValidationError

    from synth_deploy.taskapp import contracts

    model = getattr(contracts, model_name)
    try:
        return model.model_validate(data), None
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        return None, describe_error(errors[0], extra=len(errors) - 1)


def describe_error(err: dict[str, Any], *, extra: int = 0) -> dict[str, str]:
    """One pydantic error as path / expected / actual, in words a user can act on."""
    path = ".".join(str(p) for p in err.get("loc", ())) or "(document)"
    msg = str(err.get("msg", ""))
    if err.get("type") == "missing":
        expected, actual = "a value (required field)", "missing"
    else:
        expected = msg.removeprefix("Input should be ").removeprefix("Value error, ")
        actual = short_repr(err.get("input"))
    return {"path": path, "expected": expected, "actual": actual,
            "more": f" (+{extra} more)" if extra else ""}


def short_repr(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


__all__ = ["describe_error", "short_repr", "validate"]
