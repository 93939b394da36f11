"""synth-containers' contract, served for every task app under ``/containers``.

Synth's optimizers and evals (synth-optimizers' GEPA, its pipeline-RL consumers) drive a
task through this contract and its client, ``HTTPContainerClient``: give them
``{app URL}/containers``. The routes, as synth-containers 0.4.6 has them (learned from its
``sdk.py``, ``http_adapter.py`` and ``http_client.py``; it is not imported):

- ``GET /health``, ``GET /metadata`` (and ``/info``): the contract version and what this app
  can do: ``capabilities.rollout_modes`` ``["blocking", "async"]`` and
  ``capabilities.async_rollouts`` (its lease, whether records survive a restart).
- ``GET /dataset`` (and ``/taskset``): the app's datasets, their splits and row counts;
  ``POST /dataset/rows`` (and ``/taskset/tasks``) ``{"seeds": [...]}``: a row per seed, the
  app's task instance for it.
- ``GET /task_info``: the task (the app's id, name and description).
- ``GET /program``: 404 ``container_route_not_supported:program``, as for a container that
  declares no prompt fields (a task app declares none).
- ``POST /rollouts`` (and ``/rollout``): a rollout, ``submission_mode`` ``"sync"`` (the
  default: answered when done, with an early head past ``head_after_s``, as ``/rollout``)
  or ``"async"`` (202 and its id at once). Its body: ``rollout_id``, ``seed`` (or
  ``env.seed``), ``env.config``, ``policy`` (``model``, ``inference_url`` and ``config``),
  ``mode`` (``rl``/``eval``), ``safety.max_time_s``; ``lease_ttl_seconds`` optionally.
- ``GET /rollouts/{id}`` (its document, the result once done; ``?wait_ms=`` up to 10,000:
  answered as soon as it is done, or then), ``/state``, ``/events``
  (``?after=`` a cursor), ``/stream`` (the events as SSE with heartbeats), ``POST
  /rollouts/{id}/renew`` and ``/terminate``. Durability, leases and replays: `_durable`.

Every route answers only a client with the app's key (as every other route), and each
rollout runs as ``/rollout`` runs one: admitted against the same limit, under the same
bound, traced to the same store.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from synth_deploy.errors import BadRequest
from synth_deploy.serving._admission import EarlyHeads, RolloutLimits
from synth_deploy.serving._request_guards import (
    BodyTooLarge,
    bad_request_response,
    read_body,
    unknown_seed,
    unsupported_media_type,
)
from synth_deploy.serving._responses import error_response, validation_errors
from synth_deploy.serving._routes import AsgiEndpoint, Endpoint
from synth_deploy.serving.containers._client import PREFIX
from synth_deploy.serving.containers._durable import AsyncRollouts, Refused, request_digest
from synth_deploy.taskapp.config import TaskAppConfig
from synth_deploy.taskapp.contracts import RolloutRequest

CONTRACT_VERSION = "2026-05-28"  # synth-containers 0.4.6's ontology.CONTRACT_VERSION
PROTOCOL = "synth.container.contract.v1"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
# The longest a poll may wait for its rollout to finish: far inside any proxy's patience.
MAX_WAIT_MS = 10_000
_ROLLOUT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_REQUEST_VALIDATOR = RolloutRequest.__pydantic_validator__

# The app's task instance of each seed; `BadRequest` naming the field for a seed it lacks.
TaskInstances = Callable[[list[int], str], Awaitable[list[dict[str, Any]]]]


def kit_request(body: Any, rollout_id: str) -> RolloutRequest:
    """A synth-containers rollout body as the kit's `RolloutRequest` (what the app's rollout
    receives); raises `BadRequest` naming the field that is wrong."""
    if not isinstance(body, dict):
        raise BadRequest("a rollout body must be a JSON object", field="(body)")
    for name in ("env", "policy", "safety", "record"):
        if body.get(name) is not None and not isinstance(body[name], dict):
            raise BadRequest(f"{name} must be an object", field=name)
    env = body.get("env") or {}
    policy = dict(body.get("policy") or {})
    config = {k: policy[k] for k in ("model", "inference_url", "provider", "max_tokens")
              if policy.get(k) is not None}
    if "inference_url" not in config and policy.get("base_url"):
        config["inference_url"] = policy["base_url"]
    if not isinstance(policy.get("config", {}), dict):
        raise BadRequest("policy.config must be an object", field="policy.config")
    config.update(policy.get("config") or {})
    seed = body.get("seed", env.get("seed"))
    mode = body.get("mode") if body.get("mode") in ("rl", "eval") else "rl"
    data = {"run_id": rollout_id,
            "env": {"seed": seed, "config": env.get("config") or {},
                    "env_name": env.get("env_name")},
            "policy": {"policy_name": config.get("model"), "config": config},
            "mode": mode, "record": body.get("record") or {}, "safety": body.get("safety") or {}}
    try:
        return _REQUEST_VALIDATOR.validate_python(data)
    except ValidationError as exc:
        first = validation_errors(exc)[0]
        raise BadRequest(f"invalid rollout: {first['path']}: {first['message']}",
                         field=first["path"]) from None


class ContainersWire:
    """The contract's endpoints under `PREFIX` for one served app, running rollouts through
    ``rollouts``; ``task_instances(seeds, field)``: the app's task instance of each seed."""

    def __init__(self, config: TaskAppConfig, rollouts: AsyncRollouts, *,
                 limits: RolloutLimits, task_instances: TaskInstances) -> None:
        self.config, self.rollouts, self.task_instances = config, rollouts, task_instances
        self.heads = EarlyHeads(limits)
        self.heartbeat_s = limits.heartbeat_s

    def endpoints(self) -> list[Endpoint]:
        one = PREFIX + "/rollouts/{rollout_id}"
        submit = AsgiEndpoint(self.submit)
        return [
            Endpoint(PREFIX + "/rollouts", "POST", submit, "synth-containers: run a rollout, "
                     "sync or async (202)", asgi=True, errors=(409, 413, 415, 422, 503)),
            Endpoint(PREFIX + "/rollout", "POST", submit, "synth-containers: as /rollouts",
                     asgi=True, errors=(409, 413, 415, 422, 503)),
            Endpoint(PREFIX + "/health", "GET", self.health, "synth-containers: liveness"),
            Endpoint(PREFIX + "/metadata", "GET", self.metadata, "synth-containers: contract "
                     "version and capabilities"),
            Endpoint(PREFIX + "/info", "GET", self.metadata, "synth-containers: as /metadata"),
            Endpoint(PREFIX + "/task_info", "GET", self.task_info, "synth-containers: the task"),
            Endpoint(PREFIX + "/program", "GET", self.program, "synth-containers: no prompt "
                     "fields", errors=(404,)),
            Endpoint(PREFIX + "/dataset", "GET", self.dataset, "synth-containers: splits, row "
                     "counts"),
            Endpoint(PREFIX + "/taskset", "GET", self.dataset, "synth-containers: as /dataset"),
            Endpoint(PREFIX + "/dataset/rows", "POST", self.rows, "synth-containers: rows of "
                     "seeds", errors=(404, 413, 422)),
            Endpoint(PREFIX + "/taskset/tasks", "POST", self.rows, "synth-containers: as "
                     "/dataset/rows", errors=(404, 413, 422)),
            Endpoint(one, "GET", self.get_rollout, "synth-containers: a rollout, its result "
                     "once done", errors=(404,)),
            Endpoint(one + "/state", "GET", self.get_state, "synth-containers: a rollout's "
                     "state", errors=(404,)),
            Endpoint(one + "/events", "GET", self.get_events, "synth-containers: a rollout's "
                     "events after a cursor", errors=(404,)),
            Endpoint(one + "/stream", "GET", self.stream, "synth-containers: a rollout's "
                     "events as SSE", errors=(404,)),
            Endpoint(one + "/renew", "POST", self.renew, "synth-containers: renew a rollout's "
                     "lease", errors=(404, 422)),
            Endpoint(one + "/terminate", "POST", self.terminate, "synth-containers: cancel a "
                     "rollout", errors=(404,)),
        ]

    def metadata_payload(self) -> dict[str, Any]:
        config, rollouts = self.config, self.rollouts
        return {
            "runtime": {"runtime_id": config.app_id, "name": config.name,
                        "description": config.description, "version": config.version},
            "capabilities": {
                "protocol": PROTOCOL, "contract_version": CONTRACT_VERSION,
                "live_frames": "unsupported",
                "rollout_modes": ["blocking", "async"],
                "route_hints": {
                    "metadata_routes": ["/metadata", "/info"],
                    "task_info_routes": ["/task_info"],
                    "program_routes": ["/program"],
                    "dataset_routes": ["/dataset", "/dataset/rows"],
                    "taskset_routes": ["/taskset", "/taskset/tasks"],
                    "rollout_routes": ["/rollouts"],
                    "state_routes": ["/rollouts/{rollout_id}/state"],
                    "events_routes": ["/rollouts/{rollout_id}/events",
                                      "/rollouts/{rollout_id}/stream"],
                    "renew_routes": ["/rollouts/{rollout_id}/renew"]},
                "async_rollouts": {
                    "durable": rollouts.durable, "supports_idempotency": True,
                    "supports_lease_renewal": True, "supports_cancellation": True,
                    "lease_ttl_seconds": rollouts.default_ttl_s,
                    "sse_heartbeat_seconds": self.heartbeat_s},
                "metadata": {"policy_ready": True, "program_ready": False},
            },
            "metadata": {"served_by": "synth-deploy"},
        }

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "contract_version": CONTRACT_VERSION})

    async def metadata(self, request: Request) -> Response:
        return JSONResponse(self.metadata_payload())

    async def task_info(self, request: Request) -> Response:
        config = self.config
        return JSONResponse({"task": {"task_id": config.app_id, "task_name": config.name,
                                      "description": config.description},
                             "metadata": {"datasets": config.dataset_registry.describe()}})

    async def program(self, request: Request) -> Response:
        return JSONResponse({"detail": "container_route_not_supported:program"},
                            status_code=404)

    async def dataset(self, request: Request) -> Response:
        config = self.config
        splits: dict[str, int | None] = {}
        for ds in config.dataset_registry:
            for split in ds.splits:
                count = None if ds.seeds is None else len(ds.seeds)
                splits[split] = count if split not in splits or splits[split] is None \
                    else splits[split] + (count or 0)
        return JSONResponse({"dataset_id": config.app_id,
                             "splits": [{"name": n, "count": c} for n, c in splits.items()],
                             "datasets": config.dataset_registry.describe()})

    async def rows(self, request: Request) -> Response:
        config = self.config
        try:
            body = await _json_object(request, config.max_body_bytes)
            seeds = body.get("seeds", body.get("task_ids"))
            if not isinstance(seeds, list) or not seeds or not all(
                    isinstance(s, int) or (isinstance(s, str) and s.isdigit()) for s in seeds):
                raise BadRequest("seeds must be a non-empty list of whole numbers",
                                 field="seeds")
            seeds = [int(s) for s in seeds]
            if len(seeds) > config.max_seeds_per_request:
                raise BadRequest(f"at most {config.max_seeds_per_request} seeds a request, got "
                                 f"{len(seeds)}", field="seeds")
            instances = await self.task_instances(seeds, "seeds")
        except BadRequest as exc:
            return bad_request_response(exc)
        split = body.get("split")
        return JSONResponse({"split": split, "rows": [
            {"seed": seed, "split": split, "task_info": instance}
            for seed, instance in zip(seeds, instances, strict=False)]})

    async def submit(self, scope: Any, receive: Any, send: Any) -> None:
        request = Request(scope, receive, send)
        refusal = unsupported_media_type(request)
        if refusal is None:
            try:
                accepted = await self._accepted(request)
            except BadRequest as exc:
                refusal = bad_request_response(exc)
            except Refused as exc:
                refusal = error_response(exc.status, exc.code, exc.message, headers={
                    "retry-after": "1"} if exc.status == 503 else None)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        document, replayed, live, mode = accepted
        if mode == "async" or live is None or (replayed and live.done):
            status = live.http_status if live is not None and live.done else (
                202 if document["status"] == "running" else 200)
            await JSONResponse(document, status_code=status)(scope, receive, send)
            return
        pulse = self.heads.watch(send, receive)
        while not await self.rollouts.wait(live, min(self.heartbeat_s, live.ttl_s / 2)):
            live.renew()  # the client is waiting on this request: it holds the lease
        answer = JSONResponse({**live.document(), **({"replayed": True} if replayed else {})},
                              status_code=live.http_status)
        await self.heads.answer(pulse, answer, scope, receive)

    async def _accepted(self, request: Request) -> tuple[dict[str, Any], bool, Any, str]:
        body = await _json_object(request, self.config.max_body_bytes)
        rollout_id = body.get("rollout_id")
        if rollout_id is None:
            rollout_id = body["rollout_id"] = f"rollout_{uuid.uuid4().hex[:12]}"
        if not isinstance(rollout_id, str) or not _ROLLOUT_ID.match(rollout_id):
            raise BadRequest("rollout_id must be 1-128 letters, digits or ._:- (starting with "
                             "a letter or digit)", field="rollout_id")
        mode = body.get("submission_mode") or "sync"
        if mode not in ("sync", "async"):
            raise BadRequest("submission_mode must be one of: sync, async",
                             field="submission_mode")
        ttl = body.get("lease_ttl_seconds")
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float)
                                or not 0 < ttl <= 86_400):
            raise BadRequest("lease_ttl_seconds must be a number of seconds in (0, 86400]",
                             field="lease_ttl_seconds")
        req = kit_request(body, rollout_id)
        if (refused := unknown_seed(self.config, req.env.seed, "seed")) is not None:
            raise refused
        request_json = _request_json(req)
        document, replayed, live = await self.rollouts.submit(
            req, request_json, request_digest(body), mode=mode, ttl_s=ttl)
        return document, replayed, live, mode

    async def document_of(self, request: Request) -> dict[str, Any] | Response:
        rollout_id = request.path_params["rollout_id"]
        try:
            found = await self.rollouts.find(rollout_id)
        except Refused as exc:
            return error_response(exc.status, exc.code, exc.message, rollout_id=rollout_id)
        if found is None:
            return error_response(404, "unknown_rollout", f"no rollout {rollout_id!r} on this "
                                  "server", rollout_id=rollout_id)
        return found

    async def get_rollout(self, request: Request) -> Response:
        wait_s = min(_whole(request.query_params.get("wait_ms")), MAX_WAIT_MS) / 1000
        live = self.rollouts.live.get(request.path_params["rollout_id"])
        if wait_s and live is not None:  # a long poll: answered as soon as it is done
            until = time.monotonic() + wait_s
            while not live.done and (left := until - time.monotonic()) > 0:
                await self.rollouts.wait(live, left)
        found = await self.document_of(request)
        return found if isinstance(found, Response) else JSONResponse(found)

    async def get_state(self, request: Request) -> Response:
        found = await self.document_of(request)
        if isinstance(found, Response):
            return found
        keys = ("rollout_id", "status", "success_status", "status_detail", "created_at",
                "updated_at", "summary", "metadata", "lease", "error")
        return JSONResponse({k: found.get(k, "" if k == "status_detail" else None)
                             for k in keys if k in found or k == "status_detail"})

    async def get_events(self, request: Request) -> Response:
        found = await self.document_of(request)
        if isinstance(found, Response):
            return found
        after = _whole(request.query_params.get("after", request.query_params.get("cursor")))
        limit = _whole(request.query_params.get("limit")) or 1000
        events = _events(self.rollouts, found)
        shown = [e for e in events if e["seq"] > after][:limit]
        closed = found["status"] != "running"
        return JSONResponse({"rollout_id": found["rollout_id"], "cursor": {
            "kind": "sequence", "after": after, "next": shown[-1]["seq"] if shown else after,
            "high_water": len(events), "closed": closed,
            "has_more": len([e for e in events if e["seq"] > after]) > len(shown)},
            "events": shown})

    async def stream(self, request: Request) -> Response:
        found = await self.document_of(request)
        if isinstance(found, Response):
            return found
        rollouts, heartbeat_s = self.rollouts, self.heartbeat_s
        rollout_id = found["rollout_id"]
        after = _whole(request.headers.get("last-event-id") or
                       request.query_params.get("after"))

        async def frames() -> Any:
            nonlocal after, found
            while True:
                live = rollouts.live.get(rollout_id)
                events = _events(rollouts, found) if live is None else live.events
                for event in events[after:]:
                    after = event["seq"]
                    yield (f"id: {event['seq']}\nevent: {event['kind']}\n"
                           f"data: {json.dumps(event)}\n\n")
                if live is None and found["status"] == "running":  # another server runs it
                    await asyncio.sleep(min(heartbeat_s, 1.0))
                    found = await rollouts.find(rollout_id) or found
                    if found["status"] == "running":
                        yield ": heartbeat\n\n"
                    continue
                if live is None or live.done:
                    return
                live.renew()  # a client reading its stream holds its lease
                if not await rollouts.wait(live, min(heartbeat_s, live.ttl_s / 2)) \
                        and len(live.events) <= after:
                    yield ": heartbeat\n\n"

        return StreamingResponse(frames(), media_type="text/event-stream", headers=SSE_HEADERS)

    async def renew(self, request: Request) -> Response:
        rollout_id = request.path_params["rollout_id"]
        try:
            body = await _json_object(request, self.config.max_body_bytes, empty_ok=True)
            ttl = body.get("ttl_seconds")
            if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float)
                                    or not 0 < ttl <= 86_400):
                raise BadRequest("ttl_seconds must be a number of seconds in (0, 86400]",
                                 field="ttl_seconds")
        except BadRequest as exc:
            return bad_request_response(exc)
        document = await self.rollouts.renew(rollout_id, ttl)
        if document is None:
            return await self.get_rollout(request)  # a stored one, or 404
        return JSONResponse(document)

    async def terminate(self, request: Request) -> Response:
        document = await self.rollouts.terminate(request.path_params["rollout_id"],
                                                 "terminated")
        if document is None:
            return await self.get_rollout(request)
        await asyncio.sleep(0)  # the cancellation lands before the answer is read
        return JSONResponse(document)


def _request_json(req: RolloutRequest) -> bytes:
    return req.__pydantic_serializer__.to_json(req, exclude_defaults=True)


def _events(rollouts: AsyncRollouts, document: dict[str, Any]) -> list[dict[str, Any]]:
    """A rollout's events: those it had here, or (a stored one) its start and its end."""
    live = rollouts.live.get(document["rollout_id"])
    if live is not None:
        return live.events
    events = [{"seq": 1, "kind": "rollout.accepted", "at": document.get("created_at"),
               "rollout_id": document["rollout_id"], "data": {}}]
    if document["status"] != "running":
        events.append({"seq": 2, "kind": f"rollout.{document['status']}",
                       "at": document.get("updated_at"), "rollout_id": document["rollout_id"],
                       "data": {}})
    return events


def _whole(raw: str | None) -> int:
    try:
        return max(0, int(raw)) if raw else 0
    except ValueError:
        return 0


async def _json_object(request: Request, limit: int, *, empty_ok: bool = False
                       ) -> dict[str, Any]:
    try:
        raw = await read_body(request, limit)
    except BodyTooLarge:
        raise BadRequest(f"request body exceeds {limit} bytes", status=413,
                         code="body_too_large") from None
    if not raw.strip() and empty_ok:
        return {}
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}", code="invalid_json",
                         field="(body)") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object", field="(body)")
    return body


__all__ = ["CONTRACT_VERSION", "ContainersWire", "PREFIX", "kit_request"]

