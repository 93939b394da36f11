"""What a stored session says of the rollout it recorded, and where that is worked out.

A served app hands the store each rollout's session with its `RolloutFacts`: which rollout
it was, the request as the client sent it, the body it was answered, its time.
`describe_session` turns them into the session's metadata. The store does it where it
writes: in its writer child for a local file, so the server's loop never parses the
request again, masks its keys or reads the metrics back (a fifth of the server's CPU for
a traced trivial rollout, bench/server_overhead.py). When the server needs the metadata
itself (a trace returned in the response, a live export) it describes the session first.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from pydantic_core import from_json

from synth_deploy.env import mask_secrets
from synth_deploy.tracing._db._schema import AMENDMENTS_TABLE
from synth_deploy.tracing._session import SessionTrace


class RolloutFacts(NamedTuple):
    """A rollout as the server saw it, for `describe_session`."""

    head: dict[str, Any]  # which rollout: app_id, run_id, mode, seed, model, env_name, ...
    duration_s: float
    request_json: bytes  # the body as the client sent it (keys and all)
    response_json: bytes | None  # the body of its 200; None when it failed
    error: dict[str, Any] | None  # the failed rollout's error, as its answer said it
    failed_as: str = "error"  # a failed rollout's session status: "error", or "cancelled"


def describe_session(session: SessionTrace, facts: RolloutFacts) -> None:
    """Set ``session.metadata`` to `described_metadata`."""
    session.metadata = described_metadata(session.metadata, facts)


def described_metadata(metadata: dict[str, Any], facts: RolloutFacts) -> dict[str, Any]:
    """A session's metadata, given what the rollout itself put in it (``metadata``, kept
    ahead of the kit's outcome keys): which rollout it was, the request as the client sent
    it (keys masked; what it left out takes the protocol's defaults when replayed), the time
    it took, and its metrics (those set) or its error.

    Only what was sent or set: half the bytes of every field spelled out, and every traced
    rollout pays for them in pickling, encoding and the row the writer inserts."""
    return with_description(metadata, rollout_description(facts))


def rollout_description(facts: RolloutFacts) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the session's metadata says of its rollout, before and after what the rollout
    put in it (`with_description`): keys masked, so it can be kept apart (the journal)."""
    outcome: dict[str, Any] = {"duration_s": round(facts.duration_s, 6),
                               "request": mask_secrets(from_json(facts.request_json))}
    if facts.response_json is not None:
        outcome["status"] = "ok"
        outcome["metrics"] = _stored_metrics(from_json(facts.response_json)["metrics"])
    else:
        outcome["status"] = facts.failed_as
        if facts.error is not None:
            outcome["error"] = facts.error
    return facts.head, outcome


def with_description(metadata: dict[str, Any],
                     description: tuple[dict[str, Any], dict[str, Any]]) -> dict[str, Any]:
    """``metadata`` described by a `rollout_description`: which rollout first, then the
    rollout's own keys (in their place, the kit's outcome keys winning), then the rest."""
    head, outcome = description
    return {**head, **metadata, **outcome}


def lost_answer(session_id: str, error: dict[str, Any], *, carried: bool = False
                ) -> list[tuple[str, tuple[Any, ...]]]:
    """The statements that record, after the fact, that the client of a rollout stored as
    ``ok`` never got that answer (``error``: what it got instead, as an answer's error
    says it). The session's status becomes ``error``, so stats and exports leave it out;
    the triggers move its columns and the running totals with its metadata. A session not
    stored yet (its write timed out, and lands later) gets it when its row comes.
    ``carried``: the amendment is kept even for a session stored, so that it goes where
    the file's sessions go (a Modal container's, which `traces pull` applies at home)."""
    said = json.dumps(error)
    amendment = f"INSERT OR REPLACE INTO {AMENDMENTS_TABLE} (session_id, error) SELECT ?, ?"
    return [("UPDATE session_traces SET metadata = json_set(metadata, '$.status', 'error', "
             "'$.error', json(?)) WHERE session_id = ? AND json_valid(metadata) "
             "AND json_extract(metadata, '$.status') = 'ok'", (said, session_id)),
            (amendment, (session_id, said)) if carried else
            (amendment + " WHERE NOT EXISTS (SELECT 1 FROM session_traces WHERE "
             "session_id = ?)", (session_id, said, session_id))]


def _stored_metrics(answered: dict[str, Any]) -> dict[str, Any]:
    # The metrics as answered, less what was not set and the kit's cost ledger, which
    # `ledger_of` derives from the stored session (its LM calls and duration): a third of a
    # trivial rollout's metadata bytes, and stored bytes are what tracing costs most.
    stored = {name: value for name, value in answered.items() if value is not None}
    details = stored.get("details")
    if isinstance(details, dict):
        details.pop("ledger", None)
    if not details:
        stored.pop("details", None)
    return stored


__all__ = ["RolloutFacts", "describe_session", "described_metadata", "lost_answer",
           "rollout_description", "with_description"]
