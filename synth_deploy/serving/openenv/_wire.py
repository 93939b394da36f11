"""OpenEnv's wire for an app that declares an environment, under ``/openenv``.

OpenEnv's clients (``EnvClient``, TRL's, ``openenv validate``) take a base URL: give them
``{app URL}/openenv``. Served there, as OpenEnv's server has them (learned from
openenv-core's ``http_server.py``; it is not imported):

- ``WS /ws``: a session per connection. Messages ``{"type": "reset"|"step"|"state"|"close",
  "data": ...}``; answers ``{"type": "observation", "data": {"observation", "reward",
  "done"}}``, ``{"type": "state", "data": ...}`` or ``{"type": "error", "data": {"message",
  "code"}}`` with OpenEnv's codes (``CAPACITY_REACHED`` carries ``retry_after_s`` and the
  socket is closed with 1013, try again later).
- ``POST /reset``, ``POST /step``, ``GET /state``: OpenEnv's HTTP routes are stateless (each
  call makes and drops an environment); here ``/reset`` opens a session (or resets the one
  named) and names it in a cookie and the ``openenv-session-id`` header, which ``/step`` and
  ``/state`` read back: a ``requests.Session`` client (openenv-core 0.1's ``HTTPEnvClient``)
  plays whole episodes, and ``POST /close`` ends it. As OpenEnv's HTTP calls hold no
  session slot, an HTTP session holds its slot only while a call runs: at capacity, a new
  session (a WebSocket's first) takes the slot of the least recently used idle HTTP session,
  whose next call answers 404 ``session_gone``. A server full of sessions in use answers
  503 with ``Retry-After``.
- ``GET /health``, ``/metadata``, ``/schema``, ``/openapi.json``, ``POST /mcp``: what the
  environment is, and a JSON-RPC endpoint that says it offers no MCP tools.

Access: the key rule of every other route, except the five descriptive routes above, which
``openenv validate`` reads without a key and which tell nothing but the environment's name,
description, schemas and session capacity. A keyless WebSocket is refused at the handshake
(401/403, no session made). Sessions, their lease and their traces: `_sessions`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from starlette.requests import HTTPConnection, Request
from starlette.responses import Response
from starlette.websockets import WebSocket, WebSocketDisconnect

from synth_deploy.errors import BadRequest
from synth_deploy.serving._failures import AppFailures
from synth_deploy.serving._request_guards import BodyTooLarge, parse_json, read_body
from synth_deploy.serving._responses import MsgspecJSONResponse, encode_json, error_response
from synth_deploy.serving._routes import Endpoint
from synth_deploy.serving.openenv._sessions import (
    RETRY_AFTER_S,
    AtCapacity,
    EnvSession,
    EnvSessions,
    SessionGone,
)
from synth_deploy.taskapp._environment import Step
from synth_deploy.taskapp.config import TaskAppConfig

PREFIX = "/openenv"
# A base URL with the key in it, for OpenEnv's clients that cannot send a header
# (openenv-core <= 0.3): `{app URL}/openenv/key/{KEY}`.
KEYED_PREFIX = PREFIX + "/key/"
SESSION_COOKIE = "openenv_session"
SESSION_HEADER = "openenv-session-id"
API_VERSION = "1.0.0"  # the OpenEnv HTTP API this wire follows (openenv-http/1.x)
_STATE_SCHEMA = {"type": "object", "title": "State", "additionalProperties": True,
                 "properties": {"episode_id": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                                "step_count": {"type": "integer", "minimum": 0}}}
_ELSEWHERE = "openenv_base_url"  # a probe of OpenEnv's sent to the app's root
# Sessions a process holds when its environment declares no number: what one core held in
# every run of bench/openenv_scaling.py with each step within 3x its wait (twice as many
# all finish, but slower); past it a new session is refused, not a crowd let in that slows
# every session held (each sync environment's step runs on its own thread).
MAX_SESSIONS = 4096
_CLOSE_TRY_AGAIN_LATER = 1013
_CLOSE_GOING_AWAY = 1001
_CLOSE_TOO_BIG = 1009



def unkey(scope: dict[str, Any]) -> None:
    """``/openenv/key/{KEY}/...`` as ``/openenv/...`` with the key in ``X-API-Key``, rewritten
    in the scope itself before anything (the access log, an error's log line) reads the path:
    the key is never logged."""
    key, _, tail = scope["path"][len(KEYED_PREFIX):].partition("/")
    path = PREFIX + ("/" + tail if tail else "")
    scope["path"], scope["raw_path"] = path, path.encode()
    scope["headers"] = [*((k, v) for k, v in scope["headers"] if k != b"x-api-key"),
                        (b"x-api-key", key.encode())]


def openenv_sessions(config: TaskAppConfig, *, capacity: int, failures: AppFailures,
                     trace_store: Any = None, on_session: Any = None) -> EnvSessions | None:
    """The episode sessions OpenEnv's wire holds for ``config`` (None when it declares no
    environment). ``capacity``: sessions held at once (at most the environment's own number,
    else `MAX_SESSIONS`); ``failures``: where an environment's failures are logged."""
    if config.environment is None:
        return None
    declared = config.environment.max_sessions  # the environment's own cap, if lower
    capacity = min(capacity, declared if declared is not None else MAX_SESSIONS)
    return EnvSessions(config.environment, app_id=config.app_id, capacity=capacity,
                       identity=config.identity.session_fields(),
                       idle_s=config.session_idle_seconds, failures=failures,
                       trace_store=trace_store, on_session=on_session)


def openenv_endpoints(config: TaskAppConfig, sessions: EnvSessions | None,
                      failures: AppFailures, auth: Any = None) -> list[Endpoint]:
    """OpenEnv's endpoints over ``sessions`` (none without), declared with their access:
    what `openenv validate` reads is public, the episodes take the key (``auth``, which
    ``/mcp`` checks itself: its empty probe is public, its methods are not). An environment
    that fails in a session is logged by ``failures``."""
    if sessions is None:
        return []
    wire = _Wire(config, sessions, failures, auth)
    public = {"public": True}
    return [
        Endpoint(PREFIX + "/ws", "GET", wire.websocket, "OpenEnv: an episode session over "
                 "WebSocket", websocket=True),
        Endpoint(PREFIX + "/reset", "POST", wire.reset, "OpenEnv: start an episode",
                 errors=(422, 503)),
        Endpoint(PREFIX + "/step", "POST", wire.step, "OpenEnv: one step of the episode",
                 errors=(404, 422)),
        Endpoint(PREFIX + "/state", "GET", wire.state, "OpenEnv: the episode's state",
                 errors=(404,)),
        Endpoint(PREFIX + "/close", "POST", wire.close, "OpenEnv: end the HTTP session",
                 errors=(404, 409)),
        Endpoint(PREFIX + "/health", "GET", wire.health, "OpenEnv: health and capacity",
                 **public),
        Endpoint(PREFIX + "/metadata", "GET", wire.metadata, "OpenEnv: the environment",
                 **public),
        Endpoint(PREFIX + "/schema", "GET", wire.schema, "OpenEnv: action, observation and "
                 "state schemas", **public),
        Endpoint(PREFIX + "/openapi.json", "GET", wire.openapi, "OpenEnv: its OpenAPI "
                 "document", **public),
        Endpoint(PREFIX + "/mcp", "POST", wire.mcp, "OpenEnv: MCP JSON-RPC (its methods "
                 "check the key themselves)", **public),
        # OpenEnv's probes sent to the app's root (a base URL without /openenv): told where.
        *(Endpoint(path, method, _elsewhere, f"OpenEnv's {path} is under {PREFIX}",
                   errors=(404,), **public)
          for path, method in (("/metadata", "GET"), ("/schema", "GET"), ("/mcp", "POST"))),
        Endpoint("/ws", "GET", _elsewhere_socket, f"OpenEnv's /ws is under {PREFIX}",
                 websocket=True, **public),
    ]


async def _elsewhere(request: HTTPConnection) -> Response:
    return error_response(404, _ELSEWHERE, _elsewhere_message(request))


def _elsewhere_message(request: HTTPConnection) -> str:
    url = request.base_url  # a WebSocket's is ws(s)://: OpenEnv's clients take http(s)://
    url = url.replace(scheme={"ws": "http", "wss": "https"}.get(url.scheme, url.scheme))
    base = str(url).rstrip("/") + PREFIX
    return (f"this is the task app's root; OpenEnv's routes are under {PREFIX}: give "
            f"OpenEnv's clients (and `openenv validate --url`) the base URL {base}")


async def _elsewhere_socket(websocket: WebSocket) -> None:
    """A WebSocket at the root: refused at the handshake with `_elsewhere`'s 404, not the
    bare 403 of an unknown path (which reads as a key problem)."""
    message = _elsewhere_message(websocket)
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(error_response(404, _ELSEWHERE, message))
    else:  # a server without denial responses: said as OpenEnv's error message, then closed
        await websocket.accept()
        await websocket.send_json(_ws_error(_ELSEWHERE, message))
        await websocket.close(1008)


def observation_payload(result: Step) -> dict[str, Any]:
    """OpenEnv's ``{"observation", "reward", "done"}``: an OpenEnv environment's own
    serialization when it made one (its ``metadata`` beside them), else the step's."""
    if result.served is not None:
        return dict(result.served)
    return {"observation": result.observation, "reward": float(result.reward),
            "done": bool(result.done)}


class _Wire:
    def __init__(self, config: TaskAppConfig, sessions: EnvSessions,
                 failures: AppFailures, auth: Any = None) -> None:
        self.config, self.sessions, self.failures, self.auth = config, sessions, failures, auth
        self.spec = sessions.spec
        self._described: dict[str, Any] = {}
        self._describing = asyncio.Lock()  # a crowd on this public route makes one, not many

    # -- what the environment is (public) ----------------------------------------------------

    async def health(self, request: Request) -> Response:
        return MsgspecJSONResponse({"status": "healthy", "capacity": self.sessions.snapshot()})

    async def metadata(self, request: Request) -> Response:
        config = self.config
        return MsgspecJSONResponse({"name": config.name, "description": config.description,
                             "version": config.version, "readme_content": None,
                             "author": None, "documentation_url": None})

    async def schema(self, request: Request) -> Response:
        async with self._describing:
            if not self._described:  # one instance, made once, to read its declared schemas
                from synth_deploy.taskapp import _environment as environment

                with environment.EnvironmentThread():
                    env = await environment.call(self.spec.new)
                    try:
                        observation = dict(getattr(env, "observation_schema", None)
                                           or {"type": "object"})
                        self._described = {
                            "action": dict(getattr(env, "action_schema", None)
                                           or self.spec.action_schema(env)),
                            "observation": observation,
                            "reset_observation": dict(getattr(
                                env, "reset_observation_schema", None) or observation),
                            "state": _state_schema(getattr(env, "state_schema", None))}
                    finally:
                        await environment.close(env)
        return MsgspecJSONResponse(self._described)

    async def openapi(self, request: Request) -> Response:
        def op(method: str, summary: str, guarded: bool = True) -> dict[str, Any]:
            answer = {"summary": summary, "responses": {"200": {"description": "OK"}}}
            if guarded:
                answer["security"] = [{"ApiKey": []}]
            return {method: answer}

        return MsgspecJSONResponse({
            "openapi": "3.1.0",
            "info": {"title": f"{self.config.name} (OpenEnv)", "version": API_VERSION,
                     "description": self.config.description},
            "components": {"securitySchemes": {"ApiKey": {"type": "apiKey", "in": "header",
                                                          "name": "X-API-Key"}}},
            "paths": {
                "/reset": op("post", "Reset the environment (opens or names a session)"),
                "/step": op("post", "Take an action in the session's environment"),
                "/state": op("get", "The session's state"),
                "/close": op("post", "End the session (its slot is free at once)"),
                "/health": op("get", "Health and session capacity", False),
                "/metadata": op("get", "The environment's name and description", False),
                "/schema": op("get", "Action, observation and state JSON schemas", False),
                "/mcp": op("post", "JSON-RPC: MCP tools (with the key) and sessions", False),
            }})

    async def mcp(self, request: Request) -> Response:
        """JSON-RPC as OpenEnv's server answers it: ``openenv/session/create`` and ``close``,
        ``tools/list`` and ``tools/call`` in the session named by ``params.session_id``
        (what `MCPToolClient` sends). A malformed probe is answered without a key."""
        try:
            message = parse_json(await read_body(request, 64 * 1024) or b"null")
        except (BodyTooLarge, ValueError):
            message = None
        if not (isinstance(message, dict) and isinstance(message.get("method"), str)):
            return MsgspecJSONResponse(_mcp_answer(message))
        if self.auth is not None and (failure := self.auth.check(request.headers)):
            return error_response(failure.status, failure.code, failure.message)
        return MsgspecJSONResponse(await self._rpc(message, None))

    async def _rpc(self, message: Mapping[str, Any], attached: EnvSession | None
                   ) -> dict[str, Any]:
        """One JSON-RPC request's answer; ``attached``: the WebSocket's own session."""
        request_id, method = message.get("id"), message.get("method")
        params = message.get("params") or {}

        def error(code: int, text: str) -> dict[str, Any]:
            return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": text}}

        if not isinstance(params, dict):
            return error(-32602, "Params must be an object")
        if not callable(getattr(self.spec.factory, "mcp", None)):
            return _mcp_answer(message)
        if method == "openenv/session/create":
            if attached is not None:
                return {"jsonrpc": "2.0", "id": request_id,
                        "result": {"session_id": attached.id}}
            try:
                session = await self.sessions.open("mcp")
            except AtCapacity as exc:
                return error(-32000, str(exc))
            return {"jsonrpc": "2.0", "id": request_id, "result": {"session_id": session.id}}
        session = attached or self.sessions.sessions.get(str(params.get("session_id")))
        if method == "openenv/session/close":
            if session is None or session is attached:
                return error(-32602, "Unknown session_id (a WebSocket's own session closes "
                             "with its socket)")
            await self.sessions.close(session, "the client closed the session")
            return {"jsonrpc": "2.0", "id": request_id,
                    "result": {"session_id": session.id, "closed": True}}
        if method not in ("tools/list", "tools/call"):
            return error(-32601, f"Method not found: {method}")
        if session is None:
            return error(-32602, "Unknown session_id: send openenv/session/create first")
        try:
            result = await self.sessions.mcp(session, method, params)
        except BadRequest as exc:
            return error(-32602, exc.message)
        except SessionGone:
            return error(-32602, "the session was closed: its lease ran out")
        except Exception as exc:
            self.failures.error(exc, "environment session %s: MCP %s failed", session.id,
                                method)
            return error(-32603, f"the environment failed in {method}; see the server's log")
        return {"jsonrpc": "2.0", "id": request_id, "result": result}

    # -- sessions over HTTP (behind the key) -----------------------------------------------------

    async def reset(self, request: Request) -> Response:
        body = await self._body(request)
        if isinstance(body, Response):
            return body
        try:
            seed, episode_id, options = self._reset_args(body)
        except BadRequest as exc:
            return _bad_request(exc)
        session, opened = self._named(request), False
        if session is None:
            try:
                session = await self.sessions.open("http")
            except AtCapacity as exc:
                return error_response(503, "at_capacity", str(exc), active_sessions=exc.active,
                                      max_sessions=exc.capacity,
                                      headers={"retry-after": str(RETRY_AFTER_S)})
            opened = True
        try:
            first = await self.sessions.reset(session, seed, episode_id, options)
        except BadRequest as exc:
            if opened:
                await self.sessions.close(session, "its reset was refused")
            return _bad_request(exc)
        except SessionGone:
            return _gone(self.sessions)
        response = MsgspecJSONResponse(observation_payload(first),
                                headers={SESSION_HEADER: session.id})
        response.set_cookie(SESSION_COOKIE, session.id, path=PREFIX, httponly=True,
                            samesite="strict")
        return response

    async def step(self, request: Request) -> Response:
        body = await self._body(request)
        if isinstance(body, Response):
            return body
        action = body.get("action")
        if not isinstance(action, dict):
            return error_response(422, "invalid_request", "the body must be {\"action\": {...}}"
                                  " (an object the /schema action schema describes)",
                                  field="action")
        if (session := self._named(request)) is None:
            return self._unnamed(request)
        try:
            result = await self.sessions.step(session, action)
        except BadRequest as exc:
            return _bad_request(exc)
        except SessionGone:
            return _gone(self.sessions)
        return MsgspecJSONResponse(observation_payload(result))

    async def state(self, request: Request) -> Response:
        if (session := self._named(request)) is None:
            if _session_id(request):
                return self._unnamed(request)
            return MsgspecJSONResponse({"episode_id": None, "step_count": 0})
        try:
            return MsgspecJSONResponse(await self.sessions.state(session))
        except SessionGone:
            return _gone(self.sessions)

    async def close(self, request: Request) -> Response:
        if (session := self._named(request)) is None:
            return self._unnamed(request)
        await self.sessions.close(session, "the client closed the session")
        response = MsgspecJSONResponse({"session_id": session.id, "closed": True})
        response.delete_cookie(SESSION_COOKIE, path=PREFIX, httponly=True, samesite="strict")
        return response

    def _named(self, request: HTTPConnection) -> EnvSession | None:
        session_id = _session_id(request)
        session = self.sessions.sessions.get(session_id) if session_id else None
        return session if session is not None and session.transport == "http" else None

    def _unnamed(self, request: Request) -> Response:
        if _session_id(request):
            return _gone(self.sessions)
        return error_response(409, "no_session", f"no session named: POST {PREFIX}/reset "
                              f"first; its answer names the session in the {SESSION_COOKIE} "
                              f"cookie and the {SESSION_HEADER} header, send either back")

    async def _body(self, request: Request) -> dict[str, Any] | Response:
        try:
            raw = await read_body(request, self.config.max_body_bytes)
        except BodyTooLarge:
            return error_response(413, "body_too_large",
                                  f"request body exceeds {self.config.max_body_bytes} bytes")
        try:
            body = parse_json(raw) if raw.strip() else {}
        except ValueError as exc:
            return error_response(422, "invalid_json", f"request body is not valid JSON: {exc}")
        if not isinstance(body, dict):
            return error_response(422, "invalid_request", "the body must be a JSON object")
        return body

    def _reset_args(self, data: Mapping[str, Any]) -> tuple[int | None, str | None,
                                                            dict[str, Any]]:
        options = dict(data)
        seed = options.pop("seed", None)
        episode_id = options.pop("episode_id", None)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)
                                 or seed < 0):
            raise BadRequest(f"seed must be an integer >= 0, got {seed!r}", field="seed")
        if seed is not None and (why := self.config.dataset_registry.unknown_seed(seed)):
            raise BadRequest(why, code="unknown_seed", field="seed")
        if episode_id is not None and not (isinstance(episode_id, str)
                                           and 0 < len(episode_id) <= 255):
            raise BadRequest("episode_id must be a string of 1 to 255 characters",
                             field="episode_id")
        return seed, episode_id, options

    # -- sessions over a WebSocket -----------------------------------------------------------

    async def websocket(self, websocket: WebSocket) -> None:
        await websocket.accept()
        closed: list[bool] = []  # the socket was closed already (the lease, a message too big)

        def on_reap() -> None:  # the lease ran out: the session is gone, close the socket
            closed.append(True)
            asyncio.get_running_loop().create_task(_close_quietly(
                websocket, _CLOSE_GOING_AWAY, "session idle too long: its lease ran out"))

        named = self.sessions.sessions.get(websocket.query_params.get("session_id") or "")
        attached = named if named is not None and named.transport == "mcp" else None
        try:
            if attached is not None:  # MCPToolClient's: made by openenv/session/create
                session, attached.on_reap = attached, on_reap
            else:
                session = await self.sessions.open("ws", on_reap=on_reap)
        except AtCapacity as exc:
            await websocket.send_text(json.dumps({"type": "error", "data": {
                "message": str(exc), "code": "CAPACITY_REACHED", "active_sessions": exc.active,
                "max_sessions": exc.capacity, "retry_after_s": RETRY_AFTER_S}}))
            await _close_quietly(websocket, _CLOSE_TRY_AGAIN_LATER, "at capacity: retry")
            return
        reason = "the client disconnected"
        try:
            while True:
                try:
                    raw = await websocket.receive_text()
                except (WebSocketDisconnect, RuntimeError, KeyError):
                    break  # gone (a vanished client, or the reaper closed the socket)
                if len(raw) > self.config.max_body_bytes:
                    # uvicorn closes first (its ws_max_size is this limit); another server
                    # running the app (Modal's front end) hands the message over whole.
                    reason = "a message beyond max_body_bytes"
                    await _close_quietly(websocket, _CLOSE_TOO_BIG, "message exceeds "
                                         f"{self.config.max_body_bytes} bytes")
                    closed.append(True)
                    break
                answer = await self._message(session, raw)
                if answer is None:
                    reason = "the client closed the session"
                    break
                await websocket.send_text(encode_json(answer).decode())
        except WebSocketDisconnect:
            pass
        finally:
            if attached is None:  # an MCP session outlives its socket: its client closes it
                await self.sessions.close(session, reason)
            if not closed:
                await _close_quietly(websocket, 1000, "")

    async def _message(self, session: EnvSession, raw: str) -> dict[str, Any] | None:
        """The answer to one message (None: the client closed the session)."""
        try:
            message = parse_json(raw)
        except ValueError as exc:
            return _ws_error("INVALID_JSON", f"Invalid JSON: {exc}")
        kind = message.get("type") if isinstance(message, dict) else None
        data = message.get("data", {}) if isinstance(message, dict) else None
        try:
            if kind == "reset":
                if not isinstance(data, dict):
                    raise BadRequest("reset data must be an object", field="data")
                seed, episode_id, options = self._reset_args(data)
                first = await self.sessions.reset(session, seed, episode_id, options)
                return {"type": "observation", "data": observation_payload(first)}
            if kind == "step":
                if not isinstance(data, dict):
                    raise BadRequest("step data must be the action, an object", field="data")
                result = await self.sessions.step(session, data)
                return {"type": "observation", "data": observation_payload(result)}
            if kind == "state":
                return {"type": "state", "data": await self.sessions.state(session)}
            if kind == "close":
                return None
            if kind == "mcp":
                if not (isinstance(data, dict) and isinstance(data.get("method"), str)):
                    return {"type": "mcp", "data": _mcp_answer(data)}
                return {"type": "mcp", "data": await self._rpc(data, session)}
            return _ws_error("UNKNOWN_TYPE", f"Unknown message type: {kind}")
        except BadRequest as exc:
            return _ws_error("VALIDATION_ERROR", exc.message, field=exc.field)
        except SessionGone:
            return _ws_error("SESSION_ERROR", "the session was closed: its lease ran out")
        except Exception as exc:
            self.failures.error(exc, "environment session %s: %s failed", session.id, kind)
            return _ws_error("EXECUTION_ERROR", f"the environment failed in {kind}; see the "
                             "server's log")


def _state_schema(declared: Mapping[str, Any] | None) -> dict[str, Any]:
    """The environment's state schema with what the kit adds to every state."""
    if not declared:
        return _STATE_SCHEMA
    schema = dict(declared)
    schema["properties"] = {**_STATE_SCHEMA["properties"], **schema.get("properties", {})}
    return schema


def _session_id(request: HTTPConnection) -> str | None:
    return (request.headers.get(SESSION_HEADER) or request.cookies.get(SESSION_COOKIE)
            or request.query_params.get("session_id") or None)


def _bad_request(exc: BadRequest) -> Response:
    return error_response(exc.status, exc.code, exc.message,
                          **({"field": exc.field} if exc.field else {}))


def _gone(sessions: EnvSessions) -> Response:
    return error_response(404, "session_gone", "this session is closed or unknown (sessions "
                          f"idle for {sessions.idle_s:g} s are closed, and an idle HTTP "
                          "session gives its slot to a new session when the server is full); "
                          f"POST {PREFIX}/reset for a new one")


def _ws_error(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code,
                                      **{k: v for k, v in extra.items() if v is not None}}}


def _mcp_answer(message: Any) -> dict[str, Any]:
    """JSON-RPC 2.0's answer: this environment offers no MCP tools."""
    if not (isinstance(message, dict) and isinstance(message.get("method"), str)):
        return {"jsonrpc": "2.0", "id": None,
                "error": {"code": -32600, "message": "Invalid Request"}}
    request_id = message.get("id")
    if message["method"] in ("tools/list", "tools/call"):
        error = {"code": -32603, "message": "Environment does not support MCP"}
    else:
        error = {"code": -32601, "message": f"Method not found: {message['method']}"}
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


async def _close_quietly(websocket: WebSocket, code: int, reason: str) -> None:
    try:
        await websocket.close(code, reason)
    except (RuntimeError, WebSocketDisconnect, OSError):
        pass  # closed already


__all__ = ["API_VERSION", "KEYED_PREFIX", "openenv_sessions", "PREFIX", "SESSION_COOKIE",
           "SESSION_HEADER", "observation_payload", "openenv_endpoints", "unkey"]
