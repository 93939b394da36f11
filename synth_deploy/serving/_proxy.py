"""Vendor proxies: forward chat completions to OpenAI or Groq with the server's own key.

A policy running on the trainer's side can then call a vendor model through the task app
without ever holding the vendor key.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response

from synth_deploy.env import Env, redact
from synth_deploy.serving._openapi import json_body
from synth_deploy.serving._request_guards import unsupported_media_type
from synth_deploy.serving._responses import error_response
from synth_deploy.serving._routes import OBJECT, Endpoint
from synth_deploy.taskapp.config import ProxyConfig

OPENAI_API_KEY, GROQ_API_KEY = "OPENAI_API_KEY", "GROQ_API_KEY"
VENDOR_KEYS = (OPENAI_API_KEY, GROQ_API_KEY)
# Hop-by-hop and auth headers are never copied from the upstream answer.
_DROP = {"content-length", "transfer-encoding", "connection", "content-encoding", "set-cookie"}


def proxy_endpoints(
    app: Starlette,
    proxy: ProxyConfig,
    env: Env,
    *,
    read_body: Callable[[Request], Awaitable[bytes]],
    too_large: type[Exception],
) -> list[Endpoint]:
    """The enabled proxies' endpoints (behind the key, as every protocol endpoint)."""
    def endpoint(path: str, vendor: str, base_url: str, key_name: str) -> Endpoint:
        async def forward(request: Request) -> Response:
            if (resp := unsupported_media_type(request)) is not None:
                return resp
            key = env.get(key_name)
            if not key:
                return error_response(503, "missing_vendor_key",
                                      f"the {vendor} proxy is enabled but {key_name} is not set "
                                      f"on the server; add it to .env or the deployment's secrets")
            try:
                body = await read_body(request)
            except too_large:
                return error_response(413, "body_too_large", "request body too large")
            url = base_url.rstrip("/") + "/chat/completions"
            try:
                upstream = await app.state.http.post(
                    url, content=body, timeout=proxy.timeout_s,
                    headers={"Authorization": f"Bearer {key}",
                             "Content-Type": request.headers.get("content-type",
                                                                 "application/json")})
            except httpx.HTTPError as exc:
                return error_response(502, "vendor_unreachable",
                                      redact(f"{vendor} did not answer: {type(exc).__name__}: "
                                             f"{exc}", [key]))
            headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _DROP}
            return Response(redact(upstream.text, [key]) if key in upstream.text
                            else upstream.content, status_code=upstream.status_code,
                            headers=headers)

        forward.__name__ = f"proxy_{vendor.lower()}"
        return Endpoint(path, "POST", forward, "A chat completion through the server's "
                        "vendor key", errors=(413, 415, 502),
                        openapi={"requestBody": {"required": True, **json_body(OBJECT)}})

    found = []
    if proxy.enable_openai:
        found.append(endpoint("/proxy/v1/chat/completions", "OpenAI", proxy.openai_base_url,
                              OPENAI_API_KEY))
    if proxy.enable_groq:
        found.append(endpoint("/proxy/groq/v1/chat/completions", "Groq", proxy.groq_base_url,
                              GROQ_API_KEY))
    return found


__all__ = ["GROQ_API_KEY", "OPENAI_API_KEY", "VENDOR_KEYS", "proxy_endpoints"]
