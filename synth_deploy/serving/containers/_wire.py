"""synth-containers' contract, served for every task app under ``/containers``.

Synth's optimizers and evals (synth-optimizers' GEPA, its pipeline-RL consumers) drive a
task through this contract and its client, ``HTTPContainerClient``: give them
``{app URL}/containers``. Every route its client calls and its reference app
(``create_reference_app``) serves is answered, as synth-containers 0.4.6 has them (learned
from its ``http_adapter.py``, ``http_client.py`` and ``compatibility.py``; it is not
imported):

- ``GET /`` (the runtime and its task), ``/health``, ``/metadata`` (and ``/info``): the
  contract version and what this app can do (`_capabilities`: true of the kit; pause,
  checkpoints, resume and fork declared false); ``GET /compatibility`` (``?target=``): how
  each of the contract's consumers judges that; ``GET /task_info``, ``/task_catalog``.
- ``GET /taskset`` (and ``/dataset``): the app's datasets, their splits and true row counts;
  ``POST /taskset/tasks`` (and ``/dataset/rows``): rows of ``seeds`` (or ``task_ids``), or a
  page of a ``split`` (``offset``, ``limit``), each carrying its split.
- ``GET /program``: 404 ``container_route_not_supported:program`` (a task app declares no
  prompt fields).
- ``POST /rollouts`` (and ``/rollout``): a rollout, ``submission_mode`` ``"sync"`` (the
  default: answered with its document when done, failed or not, with an early head past
  ``head_after_s`` as ``/rollout``) or ``"async"`` (202 and its id at once). Its body:
  ``rollout_id``, ``seed`` (or ``env.seed``, or ``task_instance_id`` ``"seed:N"``),
  ``env.config``, ``policy`` (``model``, ``inference_url`` and ``config``), ``mode``
  (``rl``/``eval``), ``safety.max_time_s``, ``trace_correlation_id``, ``telemetry``
  (its events as a stream); ``lease_ttl_seconds`` optionally. ``POST /rollouts/prepare``
  (``telemetry`` on): a rollout id and its stream before the rollout starts.
- ``GET /rollouts/{id}`` (its document, the result once done; ``?wait_ms=`` up to 10,000:
  answered as soon as it is done, or then), ``/state``, ``/summary``, ``/usage``,
  ``/trace``, ``/artifacts``, ``/reward`` (and ``GET``/``POST /reward``), ``/events``
  (``?after=`` a sequence) and ``/stream`` (SSE with heartbeats, ``Last-Event-ID``) in the
  contract's envelope (`_events`); ``POST /rollouts/{id}/renew`` and ``/terminate``
  (answered once it is cancelled). Durability, leases and replays: `_durable`.
- What the kit cannot do (``/pause``, ``/checkpoints``, ``/resume``, ``/resume_async``,
  ``/fork``, ``/annotations``): 404 ``container_route_not_supported:NAME``, the contract's
  own answer for a route a runtime lacks.

Errors a client matches are the contract's: 404 ``{"detail": "unknown_rollout:ID"}``, 409
``{"detail": {"error": "rollout_identity_conflict", "rollout_id": ID}}``. A request the kit
cannot read keeps the kit's error body (``detail.error`` with ``code``, ``message`` and the
field's path). Every route answers only a client with the app's key, and each rollout runs
as ``/rollout`` runs one: admitted against the same limit, under the same bound, traced to
the same store.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from synth_deploy.errors import BadRequest
from synth_deploy.serving._admission import EarlyHeads, RolloutLimits
from synth_deploy.serving._correlation import correlation_id
from synth_deploy.serving._request_guards import (
    BodyTooLarge,
    bad_request_response,
    read_body,
    unknown_seed,
    unsupported_media_type,
)
from synth_deploy.serving._responses import (
    MsgspecJSONResponse,
    error_response,
    validation_errors,
)
from synth_deploy.serving._routes import AsgiEndpoint, Endpoint
from synth_deploy.serving._trace_context import TraceContextScope
from synth_deploy.serving.containers import _document as views
from synth_deploy.serving.containers._capabilities import (
    TARGETS,
    capabilities,
    compatibility_matrix,
    support,
)
from synth_deploy.serving.containers._client import PREFIX
from synth_deploy.serving.containers._datasets import (
    DEFAULT_PAGE,
    Splits,
    seed_list,
    whole_number,
)
from synth_deploy.serving.containers._durable import AsyncRollouts, Refused, request_digest
from synth_deploy.serving.containers._events import envelope, sealed, stream_descriptor
from synth_deploy.taskapp.config import TaskAppConfig
from synth_deploy.taskapp.contracts import RolloutRequest

CONTRACT_VERSION = "2026-05-28"  # synth-containers 0.4.6's ontology.CONTRACT_VERSION
PROTOCOL = "synth.container.contract.v1"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
# The longest a poll may wait for its rollout to finish: far inside any proxy's patience.
MAX_WAIT_MS = 10_000
# The longest terminate waits for its rollout's cancellation to land before answering.
TERMINATE_WAIT_S = 10.0
MAX_PREPARED = 10_000  # prepared, never started rollouts kept (the oldest let go)
TRANSPORTS = ("poll", "sse")  # the contract's websocket transport is not served
# The contract's routes for what the kit cannot do: each answers its not-supported 404.
UNSUPPORTED = {"/rollouts/{rollout_id}/pause": ("POST", "pause"),
               "/rollouts/{rollout_id}/checkpoints": (("GET", "POST"), "checkpoints"),
               "/rollouts/{rollout_id}/checkpoints/{checkpoint_id}": ("GET", "checkpoints"),
               "/checkpoints": ("GET", "checkpoints"),
               "/checkpoints/import": ("POST", "import_checkpoint"),
               "/checkpoints/{checkpoint_id}": ("GET", "checkpoints"),
               "/checkpoints/{checkpoint_id}/labels": ("POST", "checkpoints"),
               "/checkpoints/{checkpoint_id}/export": ("GET", "export_checkpoint"),
               "/rollouts/{rollout_id}/resume": ("POST", "resume"),
               "/rollouts/{rollout_id}/resume_async": ("POST", "resume"),
               "/rollouts/{rollout_id}/fork": ("POST", "fork"),
               "/rollouts/{rollout_id}/annotations": ("GET", "annotations")}
# POST-only routes whose paths a GET route by id also matches: a GET there is a wrong method.
POST_ONLY = (PREFIX + "/rollouts/prepare", PREFIX + "/checkpoints/import")
_ROLLOUT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_REQUEST_VALIDATOR = RolloutRequest.__pydantic_validator__

# The app's task instance of each seed; `BadRequest` naming the field for a seed it lacks.
TaskInstances = Callable[[list[int], str], Awaitable[list[dict[str, Any]]]]


def kit_request(body: Any, rollout_id: str, *, capture_tokens: bool = False
                ) -> RolloutRequest:
    """A synth-containers rollout body as the kit's `RolloutRequest` (what the app's rollout
    receives); raises `BadRequest` naming the field that is wrong. ``capture_tokens``: the
    app's default; a rollout whose tokens are captured is traced into its answer (its
    document carries them)."""
    _check_objects(body)
    env = body.get("env") or {}
    config = _policy_config(dict(body.get("policy") or {}), body.get("trace_correlation_id"))
    record = dict(body.get("record") or {})
    if config.get("capture_tokens", capture_tokens) is True:
        record["return_trace"] = True
    data = {"run_id": rollout_id,
            "env": {"seed": _seed(body, env), "config": env.get("config") or {},
                    "env_name": env.get("env_name")},
            "policy": {"policy_name": config.get("model"), "config": config},
            "mode": body.get("mode") if body.get("mode") in ("rl", "eval") else "rl",
            "record": record, "safety": body.get("safety") or {}}
    try:
        return _REQUEST_VALIDATOR.validate_python(data)
    except ValidationError as exc:
        first = validation_errors(exc)[0]
        raise BadRequest(f"invalid rollout: {first['path']}: {first['message']}",
                         field=first["path"]) from None


def _submission(body: dict[str, Any]) -> tuple[str, str, Any]:
    """A submission's rollout id (one made for it when it names none), its mode and its
    lease; `BadRequest` naming the field that is wrong."""
    rollout_id = body.get("rollout_id")
    if rollout_id is None:
        rollout_id = body["rollout_id"] = f"rollout_{uuid.uuid4().hex[:12]}"
    _check_rollout_id(rollout_id)
    mode = body.get("submission_mode") or "sync"
    if mode not in ("sync", "async"):
        raise BadRequest("submission_mode must be one of: sync, async",
                         field="submission_mode")
    ttl = body.get("lease_ttl_seconds")
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float)
                            or not 0 < ttl <= 86_400):
        raise BadRequest("lease_ttl_seconds must be a number of seconds in (0, 86400]",
                         field="lease_ttl_seconds")
    return rollout_id, mode, ttl


def _check_objects(body: Any) -> None:
    """`BadRequest` unless ``body`` and each of its sections given is a JSON object."""
    if not isinstance(body, dict):
        raise BadRequest("a rollout body must be a JSON object", field="(body)")
    for name in ("env", "policy", "safety", "record"):
        if body.get(name) is not None and not isinstance(body[name], dict):
            raise BadRequest(f"{name} must be an object", field=name)


def _policy_config(policy: dict[str, Any], cid: Any) -> dict[str, Any]:
    """The kit's ``policy.config`` from the contract's ``policy`` (its model, URL and own
    config) and the submission's ``trace_correlation_id``."""
    config = {k: policy[k] for k in ("model", "inference_url", "provider", "max_tokens")
              if policy.get(k) is not None}
    if "inference_url" not in config and policy.get("base_url"):
        config["inference_url"] = policy["base_url"]
    if not isinstance(policy.get("config", {}), dict):
        raise BadRequest("policy.config must be an object", field="policy.config")
    config.update(policy.get("config") or {})
    if isinstance(cid, str) and cid.strip() and correlation_id(config) is None:
        config["trace_correlation_id"] = cid.strip()
    return config


def _seed(body: dict[str, Any], env: dict[str, Any]) -> Any:
    """The seed: ``seed``, else ``env.seed``, else a ``task_instance_id`` of ``seed:N``."""
    seed = body.get("seed", env.get("seed"))
    instance = body.get("task_instance_id")
    if seed is None and isinstance(instance, str) and instance.startswith("seed:") \
            and instance[5:].isdigit():
        return int(instance[5:])
    return seed


def not_found(rollout_id: str) -> Response:
    """The contract's answer for a rollout id nobody submitted."""
    return MsgspecJSONResponse({"detail": f"unknown_rollout:{rollout_id}"}, status_code=404)


def not_supported(name: str) -> Response:
    """The contract's answer for a route a runtime does not serve."""
    return MsgspecJSONResponse({"detail": f"container_route_not_supported:{name}"}, status_code=404)


class ContainersWire:
    """The contract's endpoints under `PREFIX` for one served app, running rollouts through
    ``rollouts``; ``task_instances(seeds, field)``: the app's task instance of each seed."""

    def __init__(self, config: TaskAppConfig, rollouts: AsyncRollouts, *,
                 limits: RolloutLimits, task_instances: TaskInstances) -> None:
        self.config, self.rollouts, self.task_instances = config, rollouts, task_instances
        self.heads = EarlyHeads(limits)
        self.heartbeat_s = limits.heartbeat_s
        self.splits = Splits(config)
        self.prepared: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def endpoints(self) -> list[Endpoint]:
        one = PREFIX + "/rollouts/{rollout_id}"
        # A submission's traceparent is its rollout's parent trace (the task inherits it).
        submit = TraceContextScope(AsgiEndpoint(self.submit))
        routes = [
            Endpoint(PREFIX + "/rollouts", "POST", submit, "synth-containers: run a rollout, "
                     "sync or async (202)", asgi=True, errors=(409, 413, 415, 422, 503)),
            Endpoint(PREFIX + "/rollout", "POST", submit, "synth-containers: as /rollouts",
                     asgi=True, errors=(409, 413, 415, 422, 503)),
            Endpoint(PREFIX + "/rollouts/prepare", "POST", self.prepare, "synth-containers: "
                     "a rollout id and its event stream, before it starts",
                     errors=(400, 409, 413, 422)),
            Endpoint(PREFIX + "/", "GET", self.root, "synth-containers: the runtime and its "
                     "task"),
            Endpoint(PREFIX + "/health", "GET", self.health, "synth-containers: liveness"),
            Endpoint(PREFIX + "/metadata", "GET", self.metadata, "synth-containers: contract "
                     "version and capabilities"),
            Endpoint(PREFIX + "/info", "GET", self.metadata, "synth-containers: as /metadata"),
            Endpoint(PREFIX + "/compatibility", "GET", self.compatibility, "synth-containers: "
                     "how each consumer judges the capabilities", errors=(400,)),
            Endpoint(PREFIX + "/task_info", "GET", self.task_info, "synth-containers: the task"),
            Endpoint(PREFIX + "/task_catalog", "GET", self.task_catalog, "synth-containers: "
                     "the task and its datasets as a catalog"),
            Endpoint(PREFIX + "/program", "GET", self.program, "synth-containers: no prompt "
                     "fields", errors=(404,)),
            Endpoint(PREFIX + "/dataset", "GET", self.dataset, "synth-containers: splits, row "
                     "counts"),
            Endpoint(PREFIX + "/taskset", "GET", self.dataset, "synth-containers: as /dataset"),
            Endpoint(PREFIX + "/dataset/rows", "POST", self.rows, "synth-containers: rows of "
                     "seeds, or a page of a split", errors=(404, 413, 422)),
            Endpoint(PREFIX + "/taskset/tasks", "POST", self.rows, "synth-containers: as "
                     "/dataset/rows", errors=(404, 413, 422)),
            Endpoint(PREFIX + "/reward", ("GET", "POST"), self.reward, "synth-containers: a "
                     "rollout's reward (?rollout_id= or its body)",
                     errors=(404, 409, 413, 422)),
            Endpoint(one, "GET", self.get_rollout, "synth-containers: a rollout, its result "
                     "once done", errors=(404,)),
            Endpoint(one + "/state", "GET", self.view(views.state_view), "synth-containers: "
                     "a rollout's state", errors=(404,)),
            Endpoint(one + "/summary", "GET", self.view(views.summary_view),
                     "synth-containers: a rollout's summary", errors=(404,)),
            Endpoint(one + "/usage", "GET", self.view(views.usage_view), "synth-containers: "
                     "a rollout's token usage", errors=(404,)),
            Endpoint(one + "/trace", "GET", self.view(views.trace_view), "synth-containers: "
                     "a rollout's trace", errors=(404,)),
            Endpoint(one + "/artifacts", "GET", self.view(views.artifacts_view),
                     "synth-containers: a rollout's artifacts", errors=(404,)),
            Endpoint(one + "/reward", "GET", self.reward, "synth-containers: a rollout's "
                     "reward", errors=(404,)),
            Endpoint(one + "/events", "GET", self.get_events, "synth-containers: a rollout's "
                     "events after a cursor", errors=(404,)),
            Endpoint(one + "/stream", "GET", self.stream, "synth-containers: a rollout's "
                     "events as SSE", errors=(404,)),
            Endpoint(one + "/renew", "POST", self.renew, "synth-containers: renew a rollout's "
                     "lease", errors=(404, 422)),
            Endpoint(one + "/terminate", "POST", self.terminate, "synth-containers: cancel a "
                     "rollout", errors=(404, 422)),
        ]
        for path, (methods, name) in UNSUPPORTED.items():
            routes.append(Endpoint(PREFIX + path, methods, self.refusal(name),
                                   f"synth-containers: not supported ({name})", errors=(404,)))
        return routes

    # -- what the app is and can do ------------------------------------------------------

    def metadata_payload(self) -> dict[str, Any]:
        config, rollouts = self.config, self.rollouts
        return {
            "runtime": {"runtime_id": config.app_id, "name": config.name,
                        "description": config.description, "version": config.version,
                        "identity": config.identity.to_dict()},  # which code answers
            "capabilities": {
                "protocol": PROTOCOL, "contract_version": CONTRACT_VERSION,
                "live_frames": "unsupported",
                **capabilities(config, durable=rollouts.durable,
                               lease_ttl_s=rollouts.default_ttl_s,
                               heartbeat_s=self.heartbeat_s)},
            "metadata": {"served_by": "synth-deploy"},
        }

    def task_definition(self) -> dict[str, Any]:
        config = self.config
        return {"task_id": config.app_id, "task_name": config.name, "task_family": "",
                "description": config.description, "version": config.version,
                "benchmark": "", "metadata": {}, "resource_refs": []}

    def task_info_payload(self) -> dict[str, Any]:
        """The task as the contract's TaskInfo: its definition, its (first) dataset, what
        the app can do, its limits and inference hints."""
        config, base = self.config, self.config.base_task_info
        first = next(iter(config.dataset_registry), None)
        dataset = {"dataset_id": config.app_id, "split": None, "visible_splits": [],
                   "default_split": None, "row_count": None, "source": "", "path": "",
                   "metadata": {}}
        if first is not None:
            rows = [self.splits.count(split) for split in first.splits]
            dataset.update(dataset_id=first.id, visible_splits=list(first.splits),
                           default_split=first.default_split or (first.splits or [None])[0],
                           row_count=None if None in rows else sum(rows),  # type: ignore[arg-type]
                           path=first.storage_uri or "")
        return {"task": self.task_definition(), "dataset": dataset,
                "capabilities": self.metadata_payload()["capabilities"],
                "limits": base.limits.model_dump(exclude_none=True),
                "inference": base.inference.model_dump(exclude_none=True),
                "task_metadata": {}, "environment": config.app_id,
                "metadata": {"datasets": config.dataset_registry.describe()},
                "resource_refs": []}

    async def root(self, request: Request) -> Response:
        return MsgspecJSONResponse({"status": "ok", "contract_version": CONTRACT_VERSION,
                             "runtime": self.metadata_payload(),
                             "task_info": self.task_info_payload()})

    async def health(self, request: Request) -> Response:
        return MsgspecJSONResponse({"status": "ok", "contract_version": CONTRACT_VERSION})

    async def metadata(self, request: Request) -> Response:
        return MsgspecJSONResponse(self.metadata_payload())

    async def compatibility(self, request: Request) -> Response:
        caps = self.metadata_payload()["capabilities"]
        target = (request.query_params.get("target") or "").strip()
        if not target:
            return MsgspecJSONResponse(compatibility_matrix(caps))
        if target not in TARGETS:
            return MsgspecJSONResponse({"detail": f"invalid_compatibility_target:{target}:one of "
                                           f"{', '.join(TARGETS)}"}, status_code=400)
        return MsgspecJSONResponse(support(caps, target))

    async def task_info(self, request: Request) -> Response:
        return MsgspecJSONResponse(self.task_info_payload())

    async def task_catalog(self, request: Request) -> Response:
        config = self.config
        return MsgspecJSONResponse({
            "catalog_id": config.app_id,
            "tasks": [self.task_definition()],
            "instances": [],  # one a seed: paged through /taskset/tasks
            "metadata": {"splits": self.splits.counts(),
                         "datasets": config.dataset_registry.describe()},
            "resource_refs": []})

    async def program(self, request: Request) -> Response:
        return not_supported("program")

    def refusal(self, name: str) -> Callable[[Request], Awaitable[Response]]:
        async def refuse(request: Request) -> Response:
            _post_only(request)
            return not_supported(name)
        return refuse

    # -- datasets ------------------------------------------------------------------------

    async def dataset(self, request: Request) -> Response:
        config = self.config
        return MsgspecJSONResponse({"dataset_id": config.app_id, "splits": self.splits.counts(),
                             "datasets": config.dataset_registry.describe()})

    async def rows(self, request: Request) -> Response:
        config, splits = self.config, self.splits
        try:
            body = await _json_object(request, config.max_body_bytes, empty_ok=True)
            split = body.get("split")
            splits.check(split)
            seeds = body.get("seeds", body.get("task_ids"))
            offset = whole_number(body, "offset", 0)
            limit = whole_number(body, "limit", min(DEFAULT_PAGE, config.max_seeds_per_request))
            total = None
            if seeds in (None, []):  # a page of a split (the first one, unless named)
                if limit > config.max_seeds_per_request:
                    raise BadRequest(f"limit is at most {config.max_seeds_per_request} (the "
                                     f"app's seeds per request), got {limit}", field="limit")
                split = split or splits.first()
                seeds, total = splits.page(split, offset, limit)
            else:
                seeds = seed_list(seeds)
            if len(seeds) > config.max_seeds_per_request:
                raise BadRequest(f"at most {config.max_seeds_per_request} seeds a request, got "
                                 f"{len(seeds)}", field="seeds")
            instances = await self.task_instances(seeds, "seeds") if seeds else []
        except BadRequest as exc:
            return bad_request_response(exc)
        rows = [{"seed": seed, "task_id": f"seed:{seed}",
                 "split": splits.split_of(seed, instance) or split, "task_info": instance}
                for seed, instance in zip(seeds, instances, strict=False)]
        page: dict[str, Any] = {}
        if total is not None:
            end = offset + len(rows)
            page = {"offset": offset, "limit": limit, "total": total,
                    "next_offset": end if end < total else None}
        return MsgspecJSONResponse({"split": split, **page, "rows": rows})

    # -- rollouts ------------------------------------------------------------------------

    async def submit(self, scope: Any, receive: Any, send: Any) -> None:
        request = Request(scope, receive, send)
        refusal = unsupported_media_type(request)
        if refusal is None:
            try:
                accepted = await self._accepted(request)
            except BadRequest as exc:
                refusal = bad_request_response(exc)
            except Refused as exc:
                refusal = _refusal(exc)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        document, replayed, live, mode, stream = accepted
        if mode == "async" or live is None or (replayed and live.done):
            answer = {**document, **stream}
            status = 202 if document["status"] == "running" else 200
            await MsgspecJSONResponse(answer, status_code=status)(scope, receive, send)
            return
        pulse = self.heads.watch(send, receive)
        while not await self.rollouts.wait(live, min(self.heartbeat_s, live.ttl_s / 2)):
            live.renew()  # the client is waiting on this request: it holds the lease
        # Done, failed or not: the contract's client reads a failure from the document.
        answer = MsgspecJSONResponse({**live.document(), **stream,
                               **({"replayed": True} if replayed else {})})
        await self.heads.answer(pulse, answer, scope, receive)

    async def _accepted(self, request: Request
                        ) -> tuple[dict[str, Any], bool, Any, str, dict[str, Any]]:
        body = await _json_object(request, self.config.max_body_bytes)
        rollout_id, mode, ttl = _submission(body)
        telemetry = _telemetry(body)
        req = kit_request(body, rollout_id, capture_tokens=self.config.capture_tokens)
        if (refused := unknown_seed(self.config, req.env.seed, "seed")) is not None:
            raise refused
        request_json = _request_json(req)
        try:
            document, replayed, live = await self.rollouts.submit(
                req, request_json, request_digest(body), mode=mode, ttl_s=ttl)
        except Refused as exc:
            exc.rollout_id = rollout_id  # type: ignore[attr-defined]  # the 409 names it
            raise
        prepared = self.prepared.pop(rollout_id, None)
        stream = {} if telemetry is None and prepared is None else {"stream": stream_descriptor(
            rollout_id, (telemetry or prepared or {}).get("transport", "sse"))}
        return document, replayed, live, mode, stream

    async def prepare(self, request: Request) -> Response:
        """A rollout id and where its events will stream, before the rollout is submitted
        (``telemetry.enabled`` required, as the contract's reference app has it)."""
        try:
            body = await _json_object(request, self.config.max_body_bytes)
            telemetry = _telemetry(body)
            rollout_id = body.get("rollout_id") or f"roll_{uuid.uuid4().hex[:12]}"
            _check_rollout_id(rollout_id)
        except BadRequest as exc:
            return bad_request_response(exc)
        if telemetry is None:
            return MsgspecJSONResponse({"detail": "prepare_requires_telemetry"}, status_code=400)
        seed, instance = _seed(body, {}), body.get("task_instance_id")
        identity = {"seed": seed, "task_instance_id": instance or (
                        None if seed is None else f"seed:{seed}"),
                    "policy_ref": body.get("policy_ref") or {},
                    "policy_revision_id": body.get("policy_revision_id")}
        prepared = {"identity": identity, "transport": telemetry["transport"]}
        answer = {"rollout_id": rollout_id, **identity,
                  "stream": stream_descriptor(rollout_id, telemetry["transport"])}
        known = self.prepared.get(rollout_id)
        if known is not None:
            if known != prepared:
                return MsgspecJSONResponse({"detail": {"error": "rollout_prepare_identity_conflict",
                                                "rollout_id": rollout_id,
                                                "prepared": known["identity"],
                                                "requested": identity}}, status_code=409)
            return MsgspecJSONResponse({**answer, "replayed": True})
        self.prepared[rollout_id] = prepared
        while len(self.prepared) > MAX_PREPARED:
            self.prepared.popitem(last=False)
        return MsgspecJSONResponse(answer)

    async def document_of(self, request: Request, rollout_id: str | None = None
                          ) -> dict[str, Any] | Response:
        rollout_id = rollout_id or request.path_params["rollout_id"]
        try:
            found = await self.rollouts.find(rollout_id)
        except Refused as exc:
            return error_response(exc.status, exc.code, exc.message, rollout_id=rollout_id)
        if found is None:
            prepared = self.prepared.get(rollout_id)
            if prepared is not None:
                return {"rollout_id": rollout_id, "status": "prepared", "started": False,
                        "terminated": False,
                        "stream": stream_descriptor(rollout_id, prepared["transport"])}
            return not_found(rollout_id)
        return found

    async def get_rollout(self, request: Request) -> Response:
        _post_only(request)
        wait_s = min(_whole(request.query_params.get("wait_ms")), MAX_WAIT_MS) / 1000
        live = self.rollouts.live.get(request.path_params["rollout_id"])
        if wait_s and live is not None:  # a long poll: answered as soon as it is done
            until = time.monotonic() + wait_s
            while not live.done and (left := until - time.monotonic()) > 0:
                await self.rollouts.wait(live, left)
        found = await self.document_of(request)
        return found if isinstance(found, Response) else MsgspecJSONResponse(found)

    def view(self, render: Callable[[dict[str, Any]], dict[str, Any]]
             ) -> Callable[[Request], Awaitable[Response]]:
        """A route answering ``render`` of a rollout's document (404 for an unknown id)."""
        async def answer(request: Request) -> Response:
            found = await self.document_of(request)
            return found if isinstance(found, Response) else MsgspecJSONResponse(render(found))
        return answer

    async def reward(self, request: Request) -> Response:
        """A rollout's reward record: ``GET .../{id}/reward``, ``GET /reward?rollout_id=``,
        or ``POST /reward`` ``{"rollout_id": ...}`` (scored from the finished rollout)."""
        rollout_id = request.path_params.get("rollout_id") or \
            request.query_params.get("rollout_id")
        if request.method == "POST":
            try:
                body = await _json_object(request, self.config.max_body_bytes)
            except BadRequest as exc:
                return bad_request_response(exc)
            if body.get("evidence") is not None:
                return MsgspecJSONResponse({"detail": "provided_evidence_not_implemented"},
                                    status_code=501)
            if body.get("mode", "terminal") == "provisional":
                return MsgspecJSONResponse({"detail": {"status": "refused",
                                                "reason": "live_reward_unsupported"}},
                                    status_code=409)
            rollout_id = body.get("rollout_id")
        if not isinstance(rollout_id, str) or not rollout_id:
            return bad_request_response(BadRequest("give the rollout's id (rollout_id)",
                                                   field="rollout_id"))
        found = await self.document_of(request, rollout_id)
        if isinstance(found, Response):
            return found
        if request.method == "POST" and found["status"] in ("running", "prepared"):
            return MsgspecJSONResponse({"detail": {"status": "incomplete",
                                            "missing_evidence": ["terminal_status"]}},
                                status_code=409)
        return MsgspecJSONResponse(views.reward_view(found))

    async def get_events(self, request: Request) -> Response:
        found = await self.document_of(request)
        if isinstance(found, Response):
            return found
        after = _whole(request.query_params.get("after", request.query_params.get("cursor")))
        limit = min(_whole(request.query_params.get("limit")) or 1000, 10_000)
        events = _events(self.rollouts, found)
        later = [e for e in events if e["sequence"] > after]
        shown = [sealed(e) for e in later[:limit]]
        return MsgspecJSONResponse({"rollout_id": found["rollout_id"],
                             "stream_id": f"stream:{found['rollout_id']}", "cursor": {
            "kind": "sequence", "after": after, "next": shown[-1]["sequence"] if shown else after,
            "high_water": len(events), "closed": found["status"] not in ("running", "prepared"),
            "has_more": len(later) > len(shown)}, "events": shown})

    async def stream(self, request: Request) -> Response:
        found = await self.document_of(request)
        if isinstance(found, Response):
            return found
        rollouts, heartbeat_s, prepared = self.rollouts, self.heartbeat_s, self.prepared
        rollout_id = found["rollout_id"]
        after = _whole(request.headers.get("last-event-id") or
                       request.query_params.get("after"))
        # A prepared rollout's stream waits for it to be submitted here, a lease at most.
        give_up = time.monotonic() + rollouts.default_ttl_s

        async def frames() -> Any:
            nonlocal after, found
            while True:
                live = rollouts.live.get(rollout_id)
                if live is None and rollout_id in prepared and time.monotonic() < give_up:
                    yield ": heartbeat\n\n"
                    await asyncio.sleep(min(heartbeat_s, 0.25))
                    continue
                events = _events(rollouts, found) if live is None else live.events
                for event in events[after:]:
                    after = sealed(event)["sequence"]
                    yield (f"id: {after}\nevent: {event['kind']}\n"
                           f"data: {json.dumps(event, separators=(',', ':'))}\n\n")
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
        return MsgspecJSONResponse(document)

    async def terminate(self, request: Request) -> Response:
        """Cancel a running rollout and answer its state once the cancellation has landed
        (``cancelled``; a rollout already past stopping answers as it ended)."""
        rollout_id = request.path_params["rollout_id"]
        try:
            await _json_object(request, self.config.max_body_bytes, empty_ok=True)
        except BadRequest as exc:
            return bad_request_response(exc)
        document = await self.rollouts.terminate(rollout_id, "terminated")
        live = self.rollouts.live.get(rollout_id)
        if live is None:  # stored, another server's (its runner stops it), or none
            found = document if document is not None else await self.document_of(request)
            return found if isinstance(found, Response) else \
                MsgspecJSONResponse(views.state_view(found))
        until = time.monotonic() + TERMINATE_WAIT_S
        while not live.done and (left := until - time.monotonic()) > 0:
            await self.rollouts.wait(live, left)
        return MsgspecJSONResponse(views.state_view(live.document()))


def _check_rollout_id(rollout_id: Any) -> None:
    if not isinstance(rollout_id, str) or not _ROLLOUT_ID.match(rollout_id):
        raise BadRequest("rollout_id must be 1-128 letters, digits or ._:- (starting with "
                         "a letter or digit)", field="rollout_id")
    if rollout_id == "prepare":  # GET /rollouts/prepare could never read it
        raise BadRequest("rollout_id 'prepare' is the name of a route; choose another",
                         field="rollout_id")


def _post_only(request: Request) -> None:
    if request.method != "POST" and request.url.path in POST_ONLY:
        raise HTTPException(405, headers={"Allow": "POST"})


def _refusal(exc: Refused) -> Response:
    if exc.code == "rollout_identity_conflict":  # the contract's shape, matched by clients
        return MsgspecJSONResponse({"detail": {"error": exc.code,
                                        "rollout_id": getattr(exc, "rollout_id", None),
                                        "message": exc.message}}, status_code=409)
    return error_response(exc.status, exc.code, exc.message,
                          headers={"retry-after": "1"} if exc.status == 503 else None)


def _telemetry(body: dict[str, Any]) -> dict[str, Any] | None:
    """The submission's telemetry settings when it asks for them (None: it does not)."""
    telemetry = body.get("telemetry")
    if telemetry is None:
        return None
    if not isinstance(telemetry, dict):
        raise BadRequest("telemetry must be an object", field="telemetry")
    if not telemetry.get("enabled"):
        return None
    transport = telemetry.get("transport", "sse")
    if transport not in TRANSPORTS:
        raise BadRequest(f"telemetry.transport must be one of: {', '.join(TRANSPORTS)} "
                         f"(got {str(transport)[:20]!r}; the websocket transport is not "
                         "served: read /events or /stream)", field="telemetry.transport")
    return {"transport": transport}


def _request_json(req: RolloutRequest) -> bytes:
    return req.__pydantic_serializer__.to_json(req, exclude_defaults=True)


def _events(rollouts: AsyncRollouts, document: dict[str, Any]) -> list[dict[str, Any]]:
    """A rollout's events: those it had here, or (a stored one) its start and its end."""
    rollout_id = document["rollout_id"]
    live = rollouts.live.get(rollout_id)
    if live is not None:
        return live.events
    if document["status"] == "prepared":
        return []
    events = [envelope(rollout_id, "rollout.accepted", 1, {}, document.get("created_at"))]
    if document["status"] != "running":
        events.append(envelope(rollout_id, f"rollout.{document['status']}", 2, {},
                               document.get("updated_at")))
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


__all__ = ["CONTRACT_VERSION", "ContainersWire", "PREFIX", "kit_request", "not_found",
           "not_supported"]
