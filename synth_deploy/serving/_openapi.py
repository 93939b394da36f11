"""The OpenAPI document of a served task app: the protocol's routes with their wire models,
the app's own FastAPI routers, the vendor proxies when enabled.

Served at ``GET /openapi.json`` behind the app's key: what a trainer, a client generator or
a schema-based fuzzer (tests/serving/test_fuzz.py) needs to drive the app. The protocol's
routes bypass FastAPI's routing (see `_protocol_app`), so FastAPI cannot describe them; they
are described here, from the same pydantic models the server validates with.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from pydantic.json_schema import models_json_schema

from synth_deploy.taskapp.config import TaskAppConfig
from synth_deploy.taskapp.contracts import RolloutRequest, RolloutResponse, TaskInfo

_SECURITY = [{"ApiKey": []}, {"Bearer": []}]
_ERROR = {"$ref": "#/components/schemas/Error"}
_REASONS = {
    400: "Bad request", 401: "No API key was sent", 403: "The API key is wrong",
    404: "No such task instance", 408: "The request was not received in time",
    409: "The rollout id names another request", 413: "Body too large",
    415: "The body is not JSON", 422: "The request is invalid",
    502: "The policy endpoint failed", 503: "The server has no key configured",
    504: "The rollout exceeded safety.max_time_s",
}


def json_body(schema: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAPI content map of a JSON body with ``schema``."""
    return {"content": {"application/json": {"schema": dict(schema)}}}


def schema_ref(model: str) -> dict[str, Any]:
    """A reference to one of the protocol's models in the document's components."""
    return {"$ref": f"#/components/schemas/{model}"}


def task_info_schema() -> dict[str, Any]:
    """``/task_info``'s answer: one TaskInfo, a list of them, or the taskset (an object)."""
    return {"anyOf": [schema_ref("TaskInfo"), {"type": "array", "items": schema_ref(
        "TaskInfo")}, {"type": "object"}]}


def seed_parameters(max_seeds: int) -> list[dict[str, Any]]:
    """``/task_info``'s query: ``seed`` (repeated) or ``seeds`` (comma-separated)."""
    seed = {"type": "integer", "minimum": -(10**18) + 1, "maximum": 10**18 - 1}
    return [
        {"name": "seed", "in": "query", "required": False, "style": "form", "explode": True,
         "schema": {"type": "array", "items": seed, "maxItems": max_seeds}},
        {"name": "seeds", "in": "query", "required": False,
         "description": "comma-separated seeds",
         "schema": {"type": "string", "pattern": r"^-?[0-9]{1,18}(,-?[0-9]{1,18})*$"}}]


def _operation(endpoint: Any) -> dict[str, Any]:
    """An endpoint's OpenAPI operation, from its declaration (`_routes.Endpoint`)."""
    codes = sorted({*endpoint.errors, *(() if endpoint.public else (401, 403, 503))})
    op: dict[str, Any] = {
        "summary": endpoint.summary,
        "responses": {"200": {"description": "OK", **json_body(endpoint.ok)},
                      **{str(c): {"description": _REASONS[c], **json_body(_ERROR)}
                         for c in codes}},
        **endpoint.openapi}
    if not endpoint.public:
        op["security"] = _SECURITY
    return op


def protocol_openapi(config: TaskAppConfig, app_routes: list[Any]) -> dict[str, Any]:
    """The OpenAPI 3.1 document for an app built by `create_app` from ``config``: its
    declared endpoints, and the app's own FastAPI routers as FastAPI describes them."""
    fastapi_routing = sys.modules.get("fastapi.routing")  # no FastAPI loaded: no APIRoute
    api_routes = [r for r in app_routes
                  if fastapi_routing is not None and isinstance(r, fastapi_routing.APIRoute)]
    if api_routes:  # the app's own routers, described by FastAPI
        from fastapi.openapi.utils import get_openapi

        doc = get_openapi(title=config.name, version=config.version,
                          description=config.description, openapi_version="3.1.0",
                          routes=api_routes)
    else:
        doc = {"openapi": "3.1.0", "info": {"title": config.name,
                                            "description": config.description,
                                            "version": config.version}, "paths": {}}
    _, defs = models_json_schema(
        [(RolloutRequest, "validation"), (RolloutResponse, "serialization"),
         (TaskInfo, "serialization")], ref_template="#/components/schemas/{model}")
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas.update(defs.get("$defs", {}))
    schemas["Error"] = {"type": "object", "required": ["detail"], "properties": {"detail": {
        "type": "object", "required": ["error"], "properties": {"error": {
            "type": "object", "required": ["code", "message"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}}}}}
    components["securitySchemes"] = {
        "ApiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
        "Bearer": {"type": "http", "scheme": "bearer"}}
    paths = doc.setdefault("paths", {})
    for route in app_routes:
        endpoint = getattr(route, "declaration", None)
        if endpoint is None or endpoint.websocket:  # OpenAPI has no WebSockets
            continue
        operation = _operation(endpoint)
        paths[endpoint.path] = {method.lower(): operation for method in endpoint.method_list
                                if method != "HEAD"}
    return doc


__all__ = ["json_body", "protocol_openapi", "schema_ref", "seed_parameters",
           "task_info_schema"]
