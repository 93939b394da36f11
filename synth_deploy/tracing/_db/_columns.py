"""What stored columns mean where their writers differ: the rules every reader and the
schema's triggers share.

- An LM call's ``cost_usd``: synth-ai stores cents (``int(cost_usd * 100)``); its rows are
  those without our ``event_uid`` (every row of a file before schema version 2).
- The session columns of schema version 7 come from these paths in the session's metadata
  (our writer walks them; the triggers read them for other writers' rows).
"""

from __future__ import annotations

from typing import Any

# Which code of its app made a session (`synth_deploy.taskapp.AppIdentity`): read from its
# metadata, where the server puts them; a session another writer stored has neither.
IDENTITY_PATHS = {"app_version": "$.app_version", "app_digest": "$.app_digest"}
METADATA_PATHS = {"mode": "$.mode", "split": "$.request.env.config.split",
                  "duration_s": "$.duration_s"}
EVENT_UID_VERSION = 2  # the first schema with events.event_uid


def cost_usd_sql(alias: str | None = None, schema_version: int = EVENT_UID_VERSION) -> str:
    """An LM call's cost in dollars, as SQL over ``events`` (aliased ``alias``)."""
    column = f"{alias}." if alias else ""
    if schema_version < EVENT_UID_VERSION:
        return f"({column}cost_usd / 100.0)"
    return (f"(CASE WHEN {column}event_uid IS NULL THEN {column}cost_usd / 100.0 ELSE "
            f"{column}cost_usd END)")


def cost_usd(row: dict[str, Any]) -> float | None:
    """What `cost_usd_sql` reads, from an ``events`` row as a dict."""
    cost = row["cost_usd"]
    if cost is None or row.get("event_uid"):
        return cost
    return cost / 100.0


__all__ = ["IDENTITY_PATHS", "METADATA_PATHS", "cost_usd", "cost_usd_sql"]
