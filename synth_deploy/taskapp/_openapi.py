"""The OpenAPI document of a served task app: the protocol's routes with their wire models,
the app's own FastAPI routers, the vendor proxies when enabled.

Served at ``GET /openapi.json`` behind the app's key: what a trainer, a client generator or
a schema-based fuzzer (tests/taskapp/test_fuzz.py) needs to drive the app. The protocol's
routes bypass FastAPI's routing (see `_protocol_app`), so FastAPI cannot describe them; they
are described here, from the same pydantic models the server validates with.
"""

from __future__ import annotations

import sys
from typing import Any

from pydantic.json_schema import models_json_schema

from synth_deploy.taskapp._config import TaskAppConfig
from synth_deploy.taskapp._contracts import RolloutRequest, RolloutResponse, TaskInfo

_SECURITY = [{"ApiKey": []}, {"Bearer": []}]
_ERROR = {"$ref": "#/components/schemas/Error"}
_REASONS = {
    400: "Bad request", 401: "No API key was sent", 403: "The API key is wrong",
    404: "No such task instance", 408: "The request was not received in time",
    413: "Body too large", 415: "The body is not JSON", 422: "The request is invalid",
    502: "The policy endpoint failed", 503: "The server has no key configured",
    504: "The rollout exceeded safety.max_time_s",
}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def _responses(ok: dict[str, Any], *errors: int, auth: bool = True) -> dict[str, Any]:
    codes = sorted({*errors, *((401, 403, 503) if auth else ())})
    return {"200": {"description": "OK", **_json(ok)},
            **{str(c): {"description": _REASONS[c], **_json(_ERROR)} for c in codes}}


def _operation(summary: str, responses: dict[str, Any], *, auth: bool = True,
               **extra: Any) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": responses, **extra}
    if auth:
        op["security"] = _SECURITY
    return op


def protocol_openapi(config: TaskAppConfig, app_routes: list[Any]) -> dict[str, Any]:
    """The OpenAPI 3.1 document for an app built by `create_app` from ``config``."""
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
    ref = "#/components/schemas/{}".format
    obj = {"type": "object"}
    seed = {"type": "integer", "minimum": -(10**18) + 1, "maximum": 10**18 - 1}
    paths = doc.setdefault("paths", {})
    paths["/"] = {"get": _operation("Liveness: the app's id", _responses(obj, auth=False),
                                    auth=False)}
    paths["/health"] = {"get": _operation("Health, auth and tracing state", _responses(obj))}
    paths["/info"] = {"get": _operation("Service, dataset, rubrics, limits", _responses(obj))}
    paths["/task_info"] = {"get": _operation(
        "The taskset, or the task instance of each seed", _responses(
            {"anyOf": [{"$ref": ref("TaskInfo")}, {"type": "array", "items": {
                "$ref": ref("TaskInfo")}}, obj]}, 404, 422),
        parameters=[
            {"name": "seed", "in": "query", "required": False, "style": "form",
             "explode": True, "schema": {"type": "array", "items": seed,
                                         "maxItems": config.max_seeds_per_request}},
            {"name": "seeds", "in": "query", "required": False,
             "description": "comma-separated seeds",
             "schema": {"type": "string", "pattern": r"^-?[0-9]{1,18}(,-?[0-9]{1,18})*$"}}])}
    paths["/rollout"] = {"post": _operation(
        "Run one episode", _responses({"$ref": ref("RolloutResponse")},
                                      404, 413, 415, 422, 502, 504),
        requestBody={"required": True, **_json({"$ref": ref("RolloutRequest")})})}
    paths["/done"] = {"post": _operation("The trainer is done with this app", _responses(obj))}
    paths["/openapi.json"] = {"get": _operation("This document", _responses(obj))}
    if config.proxy is not None:
        for enabled, path in ((config.proxy.enable_openai, "/proxy/v1/chat/completions"),
                              (config.proxy.enable_groq, "/proxy/groq/v1/chat/completions")):
            if enabled:
                paths[path] = {"post": _operation(
                    "A chat completion through the server's vendor key",
                    _responses(obj, 413, 415, 502), requestBody={"required": True,
                                                                 **_json(obj)})}
    return doc


__all__ = ["protocol_openapi"]
