"""The protocol's routes besides ``/rollout``: liveness, health, the app's description, its
task instances, the trainer's ``/done`` and the OpenAPI document (synth-ai's task-app
protocol, shared/spec/task-app-protocol.md)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import anyio
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from synth_deploy.errors import BadRequest
from synth_deploy.serving._admission import RolloutLimits, RolloutStats
from synth_deploy.serving._auth import ApiKeyAuth
from synth_deploy.serving._openapi import seed_parameters, task_info_schema
from synth_deploy.serving._request_guards import (
    bad_request_response,
    requested_seeds,
    unknown_seed,
)
from synth_deploy.serving._routes import Endpoint
from synth_deploy.taskapp.config import TaskAppConfig
from synth_deploy.taskapp.contracts import TaskInfo


class CoreRoutes:
    """The handlers of one served app's core routes. ``trace_destination``: where its traces
    end up, as ``/health`` says it; ``routes``: the app's routes, for the OpenAPI document
    (read once, on its first request, when every route is in place)."""

    def __init__(self, config: TaskAppConfig, *, auth: ApiKeyAuth, stats: RolloutStats,
                 limits: RolloutLimits, traced: bool,
                 trace_destination: Mapping[str, Any] | None, routes: Any) -> None:
        self.config, self.auth, self.stats, self.limits = config, auth, stats, limits
        self.traced, self.trace_destination = traced, dict(trace_destination or {})
        self.routes = routes
        self._openapi: dict[str, Any] = {}

    def endpoints(self) -> list[Endpoint]:
        config = self.config
        return [
            Endpoint("/", ("GET", "HEAD"), self.root, "Liveness: the app's id", public=True),
            Endpoint("/health", "GET", self.health, "Health, auth, tracing and rollouts in "
                     "flight"),
            Endpoint("/info", "GET", self.info, "Service, dataset, rubrics, limits"),
            Endpoint("/task_info", "GET", self.task_info, "The taskset, or the task instance "
                     "of each seed", ok=task_info_schema(), errors=(404, 422),
                     openapi={"parameters": seed_parameters(config.max_seeds_per_request)}),
            Endpoint("/done", "POST", self.done, "The trainer is done with this app"),
            Endpoint("/openapi.json", "GET", self.openapi, "This document"),
        ]

    async def root(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "service": self.config.app_id})

    async def health(self, request: Request) -> Response:
        config, stats = self.config, self.stats
        return JSONResponse({
            "healthy": True, "service": config.app_id, "version": config.version,
            "identity": config.identity.to_dict(),
            "auth": {"required": self.auth.enabled, "enabled": self.auth.enabled},
            "tracing": {"enabled": self.traced, "destination": None, "durable": False,
                        **self.trace_destination, "sessions": stats.traced},
            "rollouts": {"in_flight": stats.in_flight, "max_in_flight": stats.capacity,
                         "head_after_s": self.limits.head_after_s},
        })

    async def info(self, request: Request) -> Response:
        config = self.config
        base = config.base_task_info
        return JSONResponse({
            "service": {"task": base.task.model_dump(exclude_none=True), "version": config.version,
                        "name": config.name, "description": config.description,
                        "identity": config.identity.to_dict()},
            "dataset": {**base.dataset.model_dump(exclude_none=True),
                        "datasets": config.dataset_registry.describe()},
            "rubrics": config.rubrics.to_info().model_dump(exclude_none=True),
            "inference": base.inference.model_dump(exclude_none=True),
            "limits": base.limits.model_dump(exclude_none=True),
        })

    async def task_info(self, request: Request) -> Response:
        config = self.config
        try:
            seeds = requested_seeds(request, config.max_seeds_per_request)
            payload = await task_instances(config, seeds, field="query.seed") if seeds else []
        except BadRequest as exc:
            return bad_request_response(exc)
        if not seeds:
            taskset = dict(config.describe_taskset()) if config.describe_taskset else {}
            return JSONResponse({
                "taskset": taskset or {"id": config.app_id, "name": config.name,
                                       "description": config.description},
                "datasets": config.dataset_registry.describe(),
                "task": config.base_task_info.task.model_dump(exclude_none=True),
                "rubric": config.rubrics.to_info().model_dump(exclude_none=True),
            })
        return JSONResponse(payload[0] if len(seeds) == 1 and len(payload) == 1 else payload)

    async def done(self, request: Request) -> Response:
        return JSONResponse({"ok": True, "service": self.config.app_id})

    async def openapi(self, request: Request) -> Response:
        if not self._openapi:  # built once: the routes are fixed by now
            from synth_deploy.serving._openapi import protocol_openapi

            self._openapi.update(protocol_openapi(self.config, self.routes))
        return JSONResponse(self._openapi)


async def task_instances(config: TaskAppConfig, seeds: list[int], *, field: str
                         ) -> list[dict[str, Any]]:
    """The app's task instance of each of ``seeds``, validated and dumped; `BadRequest` (404,
    naming the request's ``field``) for a seed its datasets lack or it has no instance for.

    A synchronous ``provide_task_instances`` runs on a worker thread: a thousand seeds must
    not stall every other request on the event loop."""
    for seed in seeds:
        if (refused := unknown_seed(config, seed, field, status=404)) is not None:
            raise refused
    provide = config.provide_task_instances

    def dumped(items: Any) -> list[dict[str, Any]]:
        return [TaskInfo.model_validate(i).model_dump(mode="json") for i in items]

    try:
        if inspect.iscoroutinefunction(provide):
            return dumped(await provide(seeds))
        return await anyio.to_thread.run_sync(lambda: dumped(provide(seeds)))
    except (LookupError, ValueError) as exc:
        if isinstance(exc, ValidationError):
            raise  # the app's instances are malformed: its failure, not the client's
        raise BadRequest(f"no task instance for seeds {seeds}: {exc}", status=404,
                         code="unknown_seed", field=field) from None


__all__ = ["CoreRoutes", "task_instances"]
