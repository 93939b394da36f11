"""The page's query parameters → typed filters; a bad value names its parameter and the fix."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import date, timedelta

from synth_deploy.errors import UsageError
from synth_deploy.tracing import SORT_KEYS, SessionFilter, since_timestamp

MAX_PAGE = 500
_INTEGER = re.compile(r"-?[0-9]+")
# Parameter → SessionFilter field, for the plain text ones.
_TEXT = {"app": "app", "model": "model", "run": "run_id", "split": "split", "mode": "mode",
         "status": "status", "app_digest": "app_digest", "reward_version": "reward_version"}
_INT64 = {"type": "integer", "minimum": -2**63, "maximum": 2**63 - 1}
# Each query parameter as the viewer's OpenAPI document declares it (`_openapi`).
FILTER_PARAMETERS: dict[str, dict[str, object]] = {
    **{name: {"type": "string"} for name in _TEXT},
    "status": {"type": "string", "enum": ["ok", "error"]},
    "seed": _INT64, "min_reward": {"type": "number"}, "max_reward": {"type": "number"},
    "since": {"type": "string", "description": "24h, 7d, 2025-01-31 or 2025-01-31T12:00"},
    "until": {"type": "string", "description": "as since; a bare date includes that day"},
}
PAGE_PARAMETERS: dict[str, dict[str, object]] = {
    "sort": {"type": "string", "enum": list(SORT_KEYS)},
    "order": {"type": "string", "enum": ["asc", "desc"]},
    "offset": {**_INT64, "minimum": 0}, "limit": {"type": "integer", "minimum": 1,
                                                  "maximum": MAX_PAGE},
}


def session_filter(params: Mapping[str, str]) -> SessionFilter:
    """``app, model, run, split, mode, status, seed, min_reward, max_reward, since, until,
    app_digest`` (which code of the app: its digest or first digits), ``reward_version``
    (whose reward the sessions are judged and shown by: a `traces rescore` version, or
    ``original``).

    ``since``/``until`` take what ``--since`` takes (``24h``, ``7d``, ``2025-01-31``,
    ``2025-01-31T12:00``); a bare date in ``until`` includes that whole day.
    """
    values: dict[str, object] = {}
    for name, field in _TEXT.items():
        text = params.get(name, "").strip()
        if text:
            values[field] = text
    if params.get("seed", "").strip():
        values["seed"] = _number(params, "seed", int)
    for name in ("min_reward", "max_reward"):
        if params.get(name, "").strip():
            values[name] = _number(params, name, float)
    if params.get("since", "").strip():
        values["since"] = _when(params, "since")
    if params.get("until", "").strip():
        values["until"] = _when(params, "until")
    return SessionFilter(**values)  # type: ignore[arg-type]


def page(params: Mapping[str, str]) -> tuple[str, bool, int, int]:
    """(sort key, descending, offset, limit) from ``sort``, ``order``, ``offset``, ``limit``."""
    sort = params.get("sort", "created") or "created"
    if sort not in SORT_KEYS:
        raise UsageError(f"sort={sort!r} is not a column the table sorts by",
                         hint=f"use one of {', '.join(SORT_KEYS)}")
    order = params.get("order", "desc") or "desc"
    if order not in ("asc", "desc"):
        raise UsageError(f"order={order!r} must be asc or desc")
    offset = _number(params, "offset", int) if params.get("offset") else 0
    limit = _number(params, "limit", int) if params.get("limit") else 50
    if offset < 0 or not 1 <= limit <= MAX_PAGE:
        raise UsageError(f"offset={offset}, limit={limit}: offset must be ≥ 0 and limit 1 to "
                         f"{MAX_PAGE}")
    return sort, order == "desc", offset, limit


def _number(params: Mapping[str, str], name: str, kind: type) -> int | float:
    text = params.get(name, "").strip()
    shown = text if len(text) <= 40 else text[:40] + "…"
    try:
        # int() also reads "1_000" and other scripts' digits; the page sends ASCII.
        if kind is int and not _INTEGER.fullmatch(text):
            raise ValueError(text)
        value = kind(text)
    except ValueError:
        raise UsageError(f"{name}={shown!r} is not {'an integer' if kind is int else 'a number'}",
                         hint=f"give {name} as a number, or leave it empty") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise UsageError(f"{name}={shown!r} is not a finite number")
    if kind is int and not -2**63 <= value < 2**63:  # what SQLite stores
        raise UsageError(f"{name}={shown!r} is out of range",
                         hint=f"{name} is a 64-bit integer")
    return value


def _when(params: Mapping[str, str], name: str) -> str:
    text = params[name].strip()
    if name == "until":
        try:  # a day picked in a date box means "up to the end of that day"
            return since_timestamp((date.fromisoformat(text) + timedelta(days=1)).isoformat())
        except ValueError:
            pass
    try:
        return since_timestamp(text)
    except UsageError as exc:
        raise UsageError(f"{name}={text!r}: {exc.message}", hint=exc.hint) from None


__all__ = ["FILTER_PARAMETERS", "MAX_PAGE", "PAGE_PARAMETERS", "page", "session_filter"]
