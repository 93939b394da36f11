"""``POST /rollout`` as a bare ASGI app: the checks before a rollout runs, admission, and the
answer (with an early head when the rollout runs long; see `_admission`).

Behind the key check every protected route has (`_routes`), in order: the media type,
admission (`_admission`: a slot, or 503 + Retry-After before the body is read), the body's
size and shape, the seed; then the rollout, holding its slot until its answer is sent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response

from synth_deploy.serving._admission import EarlyHeads, RolloutLimits, RolloutStats, at_capacity
from synth_deploy.serving._request_guards import (
    BodyTooLarge,
    bad_request_response,
    read_body,
    server_error,
    unknown_seed,
    unsupported_media_type,
)
from synth_deploy.serving._responses import error_response, validation_errors
from synth_deploy.serving._rollout_run import RolloutOutcome, RolloutRun, RolloutStop
from synth_deploy.taskapp.config import TaskAppConfig
from synth_deploy.taskapp.contracts import RolloutRequest

logger = logging.getLogger("synth_deploy.taskapp")

# pydantic-core itself: `model_validate_json` is a Python wrapper around the same call.
_REQUEST_VALIDATOR = RolloutRequest.__pydantic_validator__


class _EncodedJSON(Response):
    """A 200 whose body is JSON already encoded. Its two headers are spelled out: `Response`
    works them out for any media type and extra headers, half the cost of building one."""

    media_type = "application/json"

    def init_headers(self, headers: Mapping[str, str] | None = None) -> None:
        self.raw_headers = [(b"content-length", b"%d" % len(self.body)),
                            (b"content-type", b"application/json")]


class RolloutEndpoint:
    """The ``/rollout`` route's ASGI app: runs each validated request through ``rollouts``
    and answers its outcome; a rollout stored as ``ok`` whose answer did not reach its client
    as that (it left before the last byte, or the trace write failed and the answer said so)
    has its stored record corrected."""

    def __init__(self, config: TaskAppConfig, *, rollouts: RolloutRun,
                 limits: RolloutLimits, stats: RolloutStats) -> None:
        self.config = config
        self.rollouts = rollouts
        self.stats = stats
        self.heads = EarlyHeads(limits)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        stats = self.stats
        stats.rollout_requests += 1
        request = Request(scope, receive, send)
        refusal = unsupported_media_type(request)
        if refusal is None and not stats.admit():
            status, code, message, headers = at_capacity(stats.capacity)
            refusal = error_response(status, code, message, headers=headers)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        try:
            await self._answer(request, scope, receive, send)
        finally:
            stats.release()

    async def _answer(self, request: Request, scope: Any, receive: Any, send: Any) -> None:
        try:
            checked = await self._checked(request)
        except Exception as exc:
            logger.exception("POST /rollout failed")
            checked = await server_error(request, exc)
        if isinstance(checked, Response):
            await checked(scope, receive, send)
            return
        req, body = checked
        pulse = self.heads.watch(send, receive, RolloutStop(asyncio.current_task()))
        late_body = None
        try:
            outcome: RolloutOutcome | None = await self.rollouts.run(req, body, pulse.stop)
            if outcome.failure is None:
                response: Response = _EncodedJSON(outcome.body)
            else:
                response, late_body = outcome.failure.response(), \
                    outcome.failure.body_after_head()
        except Exception as exc:  # the kit's own failure: the app's are in the outcome
            logger.exception("POST /rollout failed")
            outcome, response = None, await server_error(request, exc)
        delivered = await self.heads.answer(pulse, response, scope, receive, late_body)
        if outcome is not None and outcome.session_id is not None and (
                outcome.write_failed or not delivered):
            await self.rollouts.answer_lost(
                outcome.session_id, req.run_id,
                "trace_write_failed" if outcome.write_failed else "client_disconnected")

    async def _checked(self, request: Request) -> Response | tuple[RolloutRequest, bytes]:
        """The request validated (with its body), or the response that refuses it."""
        limit = self.config.max_body_bytes
        try:
            body = await read_body(request, limit)
        except BodyTooLarge:
            return error_response(413, "body_too_large", f"request body exceeds {limit} bytes")
        try:
            req = _REQUEST_VALIDATOR.validate_json(body)
        except ValidationError as exc:
            errors = validation_errors(exc)
            if errors and errors[0]["type"] == "json_invalid":
                return error_response(422, "invalid_json",
                                      f"request body is not valid JSON: {exc.errors()[0]['msg']}")
            summary = "; ".join(f"{e['path']}: {e['message']}" for e in errors[:5])
            return error_response(422, "invalid_request", f"invalid rollout request: {summary}",
                                  errors=errors)
        if (refused := unknown_seed(self.config, req.env.seed, "env.seed")) is not None:
            return bad_request_response(refused, run_id=req.run_id)
        return req, body


__all__ = ["RolloutEndpoint"]
