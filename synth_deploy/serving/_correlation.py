"""Trace correlation: the id a trainer puts in the policy URL, echoed where it looks for it.

An RL trainer sends ``policy.config.inference_url = ".../v1/chat/completions?cid=trace_abc"``
and matches the rollout it gets back to the completions it served by that id. synth-ai 0.4.x
(`extract_trace_correlation_id`, `include_trace_correlation_id_in_response`) reads the id, in
this order, from ``policy.config["trace_correlation_id"]``, ``policy.config["trace"]``, a
``trace_``/``cid_`` path segment before ``/chat/completions``, then the ``cid``,
``trace_correlation_id`` or ``trace`` query parameter; and its RL-side validator
(`validate_rollout_response_for_rl`) wants it at the top level of the response, in
``pipeline_metadata`` and in ``trace.metadata``, with ``pipeline_metadata.inference_url``
holding the URL with its ``?cid=`` so the trainer can hydrate a trace that was not returned.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

_CONFIG_KEYS = ("trace_correlation_id", "trace")
_QUERY_KEYS = ("cid", "trace_correlation_id", "trace")
_PATH_PREFIXES = ("trace_", "cid_")


def correlation_id(policy_config: dict[str, Any]) -> str | None:
    """The trainer's correlation id for this rollout, or None (eval runs often have none)."""
    for key in _CONFIG_KEYS:
        value = policy_config.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    url = policy_config.get("inference_url")
    if not isinstance(url, str) or "?" not in url and "completions" not in url:
        return None  # neither a query nor a .../chat/completions path: nothing to parse
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    return _path_id(parts.path) or _query_id(parts.query)


def _path_id(path: str) -> str | None:
    """A ``trace_``/``cid_`` segment just before ``/chat/completions``."""
    segments = [s for s in path.split("/") if s]
    if len(segments) >= 3 and segments[-2:] == ["chat", "completions"] \
            and segments[-3].startswith(_PATH_PREFIXES):
        return segments[-3].strip()
    return None


def _query_id(query: str) -> str | None:
    """The first non-blank ``cid``/``trace_correlation_id``/``trace`` query parameter."""
    if not query:
        return None
    values = parse_qs(query)
    return next((v.strip() for key in _QUERY_KEYS for v in values.get(key, ()) if v.strip()),
                None)


def session_correlation(cid: str | None) -> dict[str, Any]:
    """The keys a session's metadata carries for ``cid`` (what ``trace.metadata`` shows)."""
    if not cid:
        return {}
    return {"trace_correlation_id": cid, "correlation_ids": {"trace_correlation_id": cid}}


def correlate(response: dict[str, Any], cid: str | None, inference_url: Any) -> None:
    """Fill the correlation fields a rollout's response left empty (``response``: its fields,
    before validation).

    The rollout's own values win: the kit only fills what is missing, the way synth-ai's
    helpers do, so an app that correlates by itself is left as it is. A field of the wrong
    type is left for validation to reject.
    """
    pipeline = response.get("pipeline_metadata")
    if pipeline is None or isinstance(pipeline, dict):  # a copy: the rollout's dict is its own
        pipeline = response["pipeline_metadata"] = dict(pipeline or {})
    fill = pipeline.setdefault if isinstance(pipeline, dict) else lambda key, value: None
    if isinstance(inference_url, str) and inference_url:
        if not response.get("inference_url"):
            response["inference_url"] = inference_url
        fill("inference_url", inference_url)
    cid = response.get("trace_correlation_id") or cid
    if not cid:
        return
    response["trace_correlation_id"] = cid
    fill("trace_correlation_id", cid)
    correlate_trace(response.get("trace"), cid)


def correlate_trace(trace: Any, cid: str | None) -> None:
    """Mark a returned trace (and the session nested in it) with the correlation id."""
    if not cid or not isinstance(trace, dict):
        return
    _mark(trace, cid, with_map=True)
    nested = trace.get("session_trace")
    if isinstance(nested, dict):
        _mark(nested, cid, with_map=False)


def _mark(trace: dict[str, Any], cid: str, *, with_map: bool) -> None:
    metadata = trace.get("metadata")
    if not isinstance(metadata, dict):
        metadata = trace["metadata"] = {}
    metadata.setdefault("trace_correlation_id", cid)
    if with_map:
        ids = metadata.get("correlation_ids")
        ids = dict(ids) if isinstance(ids, dict) else {}
        ids.setdefault("trace_correlation_id", cid)
        metadata["correlation_ids"] = ids


__all__ = ["correlate", "correlate_trace", "correlation_id", "session_correlation"]
