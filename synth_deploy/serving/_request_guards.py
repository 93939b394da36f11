"""What the server checks about a request before an app's code sees it.

The protocol's own routes skip FastAPI's machinery (see `_protocol_app`), so what FastAPI would
have done for them is done here, in the protocol's error shape: a wrong method is a 405 with
``Allow``, a body that is not JSON a 415, a seed list that is not small ASCII integers a 422,
and an unexpected exception a bare 500 whose traceback goes to the log, never to the client.
A body is parsed by `parse_json`, whose nesting is bounded: a deep document is malformed JSON
(422), never a RecursionError.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from pydantic_core import from_json
from starlette.exceptions import HTTPException
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.requests import Request
from starlette.responses import Response

from synth_deploy.errors import BadRequest
from synth_deploy.serving._responses import error_response
from synth_deploy.taskapp.config import TaskAppConfig

logger = logging.getLogger("synth_deploy.taskapp")

# ASCII digits only (str.isdigit() accepts "²" and "٣"), and few enough of them that int()
# is cheap and the value fits the int64 a trainer's seed is.
_SEED = re.compile(r"-?[0-9]{1,18}")
_JSON_TYPE = re.compile(r"application/(?:[\w.+-]+\+)?json", re.ASCII)


async def http_error(request: Request, exc: Exception) -> Response:
    """An `HTTPException` in the protocol's error shape, its headers (``Allow``) kept."""
    assert isinstance(exc, HTTPException)
    if isinstance(getattr(exc, "detail", None), dict):  # FastAPI's, from an app's router
        from starlette.responses import JSONResponse

        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code,
                            headers=exc.headers)
    codes = {404: "not_found", 405: "method_not_allowed"}
    message = str(exc.detail)
    if exc.status_code == 405 and exc.headers and "Allow" in exc.headers:
        message = f"{request.method} is not allowed on {request.url.path}; use " \
                  f"{' or '.join(sorted(exc.headers['Allow'].split(', ')))}"
    return error_response(exc.status_code, codes.get(exc.status_code, "http_error"), message,
                          headers=exc.headers)


async def server_error(request: Request, exc: Exception) -> Response:
    """A 500 that says nothing of the cause: the traceback is logged by the server."""
    return error_response(500, "internal_error", "the task app failed while handling "
                          f"{request.method} {request.url.path}; see the server's log")


def guarded(router: Any) -> Any:
    """``router`` answering wrong methods with 405 and failures with a plain 500."""
    return ServerErrorMiddleware(ExceptionMiddleware(router, handlers={
        HTTPException: http_error}), handler=server_error)


def raw_header(request: Request, name: bytes) -> str | None:
    """The first value of header ``name`` (lower case), read from the ASGI scope.

    For the hot path: `request.headers` builds a `Headers` object, and each of its lookups
    lowercases and encodes the name again (bench/server_instructions.py counts what a
    trivial rollout costs).
    """
    for key, value in request.scope["headers"]:
        if key == name:  # ASGI servers lowercase header names
            return value.decode("latin-1")
    return None


def unsupported_media_type(request: Request) -> Response | None:
    """415 unless the body is declared JSON (no Content-Type at all is read as JSON)."""
    declared = raw_header(request, b"content-type")
    if declared is None or declared == "application/json" \
            or _JSON_TYPE.fullmatch(declared.split(";", 1)[0].strip().lower()):
        return None
    return error_response(415, "unsupported_media_type",
                          f"the request body must be JSON (Content-Type: application/json), "
                          f"got {declared.split(';', 1)[0].strip()[:80]!r}")


def requested_seeds(request: Request, limit: int) -> list[int]:
    """The seeds of ``?seed=N`` (repeatable) / ``?seeds=A,B``, as the OpenAPI document
    declares them; `BadRequest` (422) when one is not an ASCII integer (an empty one neither:
    ``?seeds=`` is not "no seeds") or there are more than ``limit``."""
    params = request.query_params
    raw = [(name, part) for name in ("seed", "seeds") for value in params.getlist(name)
           for part in (value.split(",") if name == "seeds" else (value,))]
    if len(raw) > limit:
        raise BadRequest(f"{len(raw)} seeds asked for; at most {limit} per request",
                         code="too_many_seeds", field="query.seed",
                         hint="ask for the seeds in batches")
    for name, text in raw:
        if not _SEED.fullmatch(text):
            shown = text if len(text) <= 24 else text[:24] + "…"
            raise BadRequest(f"{name} must be an integer of at most 18 digits, got {shown!r}",
                             code="invalid_seed", field=f"query.{name}",
                             hint="leave the parameter out for the taskset; "
                                  "seeds=A,B takes no spaces or empty parts")
    return [int(text) for _, text in raw]


def unknown_seed(config: TaskAppConfig, seed: int | None, field: str, *,
                 status: int = 422) -> BadRequest | None:
    """The refusal of a ``seed`` the app's datasets do not have (None: it has it, or no seed
    was given), naming the request's ``field``: 422 for a rollout's, 404 for a lookup's."""
    if seed is None or (why := config.dataset_registry.unknown_seed(seed)) is None:
        return None
    return BadRequest(why, status=status, code="unknown_seed", field=field)


def bad_request_response(exc: BadRequest, **extra: Any) -> Response:
    """A `BadRequest` as the protocol's error body: its status, code, message and field."""
    if exc.field:
        extra["errors"] = [{"path": exc.field, "message": exc.message}]
    if exc.hint:
        extra["hint"] = exc.hint
    return error_response(exc.status, exc.code, exc.message, **extra)


def parse_json(raw: bytes | str) -> Any:
    """``raw`` as JSON, parsed as `/rollout` validates its body (pydantic's parser): nesting
    deeper than it takes is a `ValueError` that says so, as any malformed document is.

    The standard library's parser recurses once a level: a deep enough document raises
    RecursionError, which no handler expects (a 500, a dropped WebSocket), and a document it
    does take can still be too deep for the code that walks it afterwards.
    """
    return from_json(raw)


class BodyTooLarge(Exception):
    """A request body beyond the app's ``max_body_bytes``."""


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, or `BodyTooLarge` as soon as it passes ``limit`` bytes."""
    declared = raw_header(request, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    # Straight from the ASGI receive channel: the limit holds for chunked bodies too.
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


__all__ = ["BodyTooLarge", "bad_request_response", "guarded", "http_error", "parse_json",
           "raw_header", "read_body", "requested_seeds", "server_error", "unsupported_media_type"]
