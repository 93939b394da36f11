"""`TraceContextScope`: a request's W3C ``traceparent`` held for the work it runs.

Wraps an endpoint's ASGI callable: what the endpoint runs in its task (the rollout, its
tracer, its policy calls) reads the caller's trace context (`synth_deploy.tracing.
incoming_trace_context`), so the rollout's spans and policy calls join the caller's trace.
"""

from __future__ import annotations

from typing import Any

from synth_deploy.tracing import TRACEPARENT, incoming_trace_context

_HEADER = TRACEPARENT.encode()


class TraceContextScope:
    """``app`` run inside the trace context of its request's ``traceparent`` header (none:
    the work starts a trace of its own)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        for name, value in scope["headers"]:
            if name == _HEADER:
                with incoming_trace_context(value):
                    await self.app(scope, receive, send)
                return
        await self.app(scope, receive, send)  # the common case: nothing to hold


__all__ = ["TraceContextScope"]
