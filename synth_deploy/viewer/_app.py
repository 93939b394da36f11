"""The viewer's ASGI app: the page, its assets, and the JSON it reads (all GET, all read-only).

    GET /                          the page (static/index.html)
    GET /static/{file}             its script and style, shipped in the package
    GET /api/choices               values for the filters, the store's size and time span
    GET /api/sessions?FILTER&sort=&order=&offset=&limit=   one page of the table
    GET /api/summary?FILTER        reward distribution, reward over time, scores, error rate,
                                   and which code of each app made the sessions
    GET /api/sessions/{id}         one session, turn by turn
    GET /api/compare?by=model|run&a=&b=&FILTER             per-seed rewards of two sides
    GET /api/export.jsonl?FILTER   SFT JSONL of the filtered sessions (the CLI's export)
    GET /api/openapi.json          this API as an OpenAPI document

FILTER is ``app, model, run, split, mode, status, seed, min_reward, max_reward, since,
until, app_digest, reward_version`` (see `_params.session_filter`). Errors are
``{"error": {"message", "hint"}}`` with 400 (bad parameter), 404 (no such session) or 500
(the store failed).

Hosts other than loopback names are refused (a web page elsewhere cannot reach the traces by
pointing a DNS name at 127.0.0.1), and the page may load nothing but its own files.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from synth_deploy.errors import SynthDeployError, UsageError
from synth_deploy.tracing import (
    ORIGINAL_REWARD,
    SessionNotFoundError,
    TraceStore,
    browse_sessions,
    compare_by_seed,
    export_sft,
    filter_choices,
    identity_groups,
    reward_summary,
    reward_versions,
    reward_versions_of,
)
from synth_deploy.viewer import _params
from synth_deploy.viewer._replay import session_replay

STATIC = Path(__file__).parent / "static"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
# The page loads only its own files; images come inline as data: URLs.
_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; connect-src 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def create_viewer_app(store: TraceStore, *,
                      allowed_hosts: Sequence[str] | None = LOOPBACK_HOSTS) -> Starlette:
    """The viewer over ``store`` (opened by the caller; it is only read).

    ``allowed_hosts``: the Host names the app answers (None: any, for a deliberate bind
    beyond loopback).
    """

    def api(handler: Callable[[Request], Any]) -> Callable[[Request], Response]:
        def endpoint(request: Request) -> Response:  # sync: Starlette runs it on a thread
            try:
                return _json(handler(request))
            except SessionNotFoundError as exc:
                return _error(404, exc)
            except UsageError as exc:
                return _error(400, exc)
            except SynthDeployError as exc:
                return _error(500, exc)
        return endpoint

    def choices(request: Request) -> Any:
        versions = [v["version"] for v in reward_versions(store)]
        return {**filter_choices(store), "store": store.display,
                "reward_version": [ORIGINAL_REWARD, *sorted(versions)]}

    def sessions(request: Request) -> Any:
        sort, descending, offset, limit = _params.page(request.query_params)
        return browse_sessions(store, _params.session_filter(request.query_params), sort=sort,
                               descending=descending, offset=offset, limit=limit).to_dict()

    def summary(request: Request) -> Any:
        where = _params.session_filter(request.query_params)
        # With the sessions' figures, which code of each app made them (newest first).
        return {**reward_summary(store, where).to_dict(),
                "identities": [g.to_dict() for g in identity_groups(store, where, limit=20)]}

    def session(request: Request) -> Any:
        trace = store.get_session(request.path_params["session_id"])
        return {**session_replay(trace),
                "reward_versions": reward_versions_of(store, trace.session_id)}

    def compare(request: Request) -> Any:
        q = request.query_params
        return compare_by_seed(store, q.get("a", ""), q.get("b", ""),
                               by=q.get("by", "model"),  # type: ignore[arg-type]
                               where=_params.session_filter(q)).to_dict()

    def export(request: Request) -> Response:
        try:
            where = _params.session_filter(request.query_params)
        except UsageError as exc:
            return _error(400, exc)
        folder = tempfile.TemporaryDirectory(prefix="synth-deploy-export-")
        out = Path(folder.name) / "sft.jsonl"
        try:
            result = export_sft(store, out, where=where)
        except SynthDeployError as exc:
            folder.cleanup()
            return _error(400 if isinstance(exc, UsageError) else 500, exc)
        return FileResponse(out, media_type="application/x-ndjson", filename="sft.jsonl",
                            headers={"X-Examples": str(result.examples),
                                     "X-Sessions": str(result.sessions)},
                            background=BackgroundTask(folder.cleanup))

    def index(request: Request) -> Response:
        return FileResponse(STATIC / "index.html")

    def openapi(request: Request) -> Any:
        from synth_deploy.viewer._openapi import viewer_openapi

        return viewer_openapi()

    routes = [
        Route("/", index),
        Route("/api/choices", api(choices)),
        Route("/api/sessions", api(sessions)),
        Route("/api/summary", api(summary)),
        Route("/api/sessions/{session_id:str}", api(session)),
        Route("/api/compare", api(compare)),
        Route("/api/export.jsonl", export),
        Route("/api/openapi.json", api(openapi)),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    middleware = [Middleware(_SecurityHeaders)]
    if allowed_hosts is not None:
        middleware.insert(0, Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts)))
    return Starlette(routes=routes, middleware=middleware)


class _SecurityHeaders:
    """Adds `_SECURITY_HEADERS` to every response (the assets' too) that lacks them."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                have = {k.lower() for k, _ in message.get("headers", [])}
                extra = [(k.lower().encode(), v.encode()) for k, v in _SECURITY_HEADERS.items()
                         if k.lower().encode() not in have]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, with_headers)


def _json(data: Any, status: int = 200) -> Response:
    try:
        body = json.dumps(data, allow_nan=False, separators=(",", ":"), default=str)
    except ValueError:  # a NaN or infinite reward: JSON has no spelling for it
        body = json.dumps(_finite(data), separators=(",", ":"), default=str)
    return Response(body, status_code=status, media_type="application/json")


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _error(status: int, exc: SynthDeployError) -> Response:
    return _json({"error": {"type": type(exc).__name__, "message": exc.message,
                            "hint": exc.hint}}, status)


__all__ = ["LOOPBACK_HOSTS", "create_viewer_app"]
