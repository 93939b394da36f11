"""The viewer's OpenAPI document (``GET /api/openapi.json``): its read-only JSON API, with
every query parameter as `_params` reads it, for a client generator or a schema-based fuzzer
(tests/serving/test_fuzz.py holds the viewer to it: no answer a server error)."""

from __future__ import annotations

from typing import Any

from synth_deploy.viewer._params import FILTER_PARAMETERS, PAGE_PARAMETERS

_OBJECT = {"type": "object"}
_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message"], "properties": {
        "type": {"type": "string"}, "message": {"type": "string"},
        "hint": {"type": ["string", "null"]}}}}}


def _query(parameters: dict[str, dict[str, object]], **more: dict[str, object]
           ) -> list[dict[str, Any]]:
    return [{"name": name, "in": "query", "required": False, "schema": schema}
            for name, schema in {**parameters, **more}.items()]


def _get(summary: str, parameters: list[dict[str, Any]], *, ok: dict[str, Any] | None = None,
         missing: bool = False) -> dict[str, Any]:
    responses: dict[str, Any] = {
        "200": {"description": "OK", "content": ok or {"application/json": {
            "schema": _OBJECT}}},
        "400": {"description": "A parameter is wrong (its name and the fix)",
                "content": {"application/json": {"schema": _ERROR}}}}
    if missing:
        responses["404"] = {"description": "No such session",
                            "content": {"application/json": {"schema": _ERROR}}}
    return {"get": {"summary": summary, "parameters": parameters, "responses": responses}}


def viewer_openapi() -> dict[str, Any]:
    """The OpenAPI 3.1 document of `create_viewer_app`'s JSON endpoints."""
    side = {"type": "string", "minLength": 1}
    return {"openapi": "3.1.0", "info": {
        "title": "synth-deploy traces view", "version": "1",
        "description": "Read-only JSON over a trace store: sessions, summaries, replays, "
                       "comparisons, SFT export."}, "paths": {
        "/api/choices": _get("Values for the filters, the store's size and time span", []),
        "/api/sessions": _get("One page of the sessions table",
                              _query(FILTER_PARAMETERS, **PAGE_PARAMETERS)),
        "/api/summary": _get("Reward distribution, reward over time, scores, error rate",
                             _query(FILTER_PARAMETERS)),
        "/api/sessions/{session_id}": _get("One session, turn by turn", [
            {"name": "session_id", "in": "path", "required": True,
             "schema": {"type": "string"}}], missing=True),
        "/api/compare": _get("Per-seed rewards of two models or runs", _query(
            FILTER_PARAMETERS, by={"type": "string", "enum": ["model", "run"]}, a=side,
            b=side)),
        "/api/export.jsonl": _get("The filtered sessions as SFT JSONL", _query(
            FILTER_PARAMETERS), ok={"application/x-ndjson": {"schema": {"type": "string"}}}),
    }}


__all__ = ["viewer_openapi"]
