"""Vendor proxies forward with the server's key, which never comes back to the client."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from toy_apps import proxy_config

from synth_deploy.env import Env
from synth_deploy.serving import create_app

VENDOR_KEY = "sk-vendor-secret-123456"


def upstream_app():
    """A stand-in for OpenAI/Groq: checks the bearer key and echoes what it got."""
    seen = []

    async def completions(request: Request):
        seen.append((request.url.path, request.headers.get("authorization")))
        if request.headers.get("authorization") != f"Bearer {VENDOR_KEY}":
            return JSONResponse({"error": {"message": "Incorrect API key provided"}}, 401)
        body = await request.json()
        return JSONResponse({"choices": [{"message": {"role": "assistant",
                                                      "content": f"echo {body['model']}"}}]})

    app = Starlette(routes=[Route("/{path:path}", completions, methods=["POST"])])
    app.state.seen = seen
    return app


VENDOR_ENV = Env({"OPENAI_API_KEY": VENDOR_KEY, "GROQ_API_KEY": VENDOR_KEY})


def proxied_server(serve, api_key, env, upstream=None):
    upstream = upstream or serve(upstream_app())
    server = serve(create_app(proxy_config(upstream.url), api_keys=[api_key], env=env))
    return server, upstream


@pytest.fixture
def proxied(serve, api_key):
    return proxied_server(serve, api_key, VENDOR_ENV)


@pytest.mark.parametrize(("path", "upstream_path"), [
    ("/proxy/v1/chat/completions", "/chat/completions"),
    ("/proxy/groq/v1/chat/completions", "/groq/chat/completions"),
])
def test_proxy_forwards_with_the_server_key(proxied, api_key, path, upstream_path):
    server, upstream = proxied
    resp = httpx.post(server.url + path, headers={"X-API-Key": api_key},
                      json={"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status_code == 200
    assert resp.json()["choices"][0]["message"]["content"] == "echo gpt-x"
    assert upstream.app.state.seen[-1] == (upstream_path, f"Bearer {VENDOR_KEY}")
    assert VENDOR_KEY not in resp.text and api_key not in str(upstream.app.state.seen)


def test_proxy_without_vendor_key_is_503_with_the_variable_name(serve, api_key):
    # The server's resolved settings hold no vendor key (the process environment may).
    server, upstream = proxied_server(serve, api_key, Env())
    resp = httpx.post(server.url + "/proxy/v1/chat/completions",
                      headers={"X-API-Key": api_key}, json={"model": "m", "messages": []})
    assert resp.status_code == 503
    assert "OPENAI_API_KEY" in resp.json()["detail"]["error"]["message"]
    assert upstream.app.state.seen == []


def test_proxy_with_unreachable_vendor_is_502(serve, api_key):
    server = serve(create_app(proxy_config("http://127.0.0.1:9"), api_keys=[api_key],
                              env=VENDOR_ENV))
    resp = httpx.post(server.url + "/proxy/v1/chat/completions",
                      headers={"X-API-Key": api_key}, json={"model": "m", "messages": []})
    assert resp.status_code == 502 and VENDOR_KEY not in resp.text


def test_proxy_routes_absent_when_disabled(math_server, api_key):
    resp = httpx.post(math_server.url + "/proxy/v1/chat/completions",
                      headers={"X-API-Key": api_key}, json={})
    assert resp.status_code in (404, 405)
