"""The client a served app calls out with (``ctx.http``; the policy call and the vendor proxy
go through the same session): httpx's API on one aiohttp session made at start-up, bounded,
no redirects, link-local refused on the address connected to, certificates verified.

Each test runs its calls inside a rollout of a real served app against real servers on
127.0.0.1.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import threading
import time

import httpx
import pytest
from standins.health_servers import SelfSignedTLSServer, self_signed_cert
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse
from starlette.routing import Route
from toy_apps import toy_config

from synth_deploy.serving import RolloutLimits, create_app
from synth_deploy.taskapp import call_policy
from synth_deploy.taskapp.policy import refused_address
from synth_deploy.tls import client_ssl_context

# Reads uvicorn's or aiohttp's internals the kit relies on: CI runs it on the newest releases too.
pytestmark = pytest.mark.upstream


def upstream_app(hold_count: int = 1) -> Starlette:
    """/hold answers only once ``hold_count`` of them are open at once (and counts the most
    open together); /now answers at once; /moved redirects to /secret, which counts hits."""
    arrived: list[asyncio.Event] = []
    state = {"open": 0, "most_open": 0, "secret_hits": 0}

    async def hold(request):
        state["open"] += 1
        state["most_open"] = max(state["most_open"], state["open"])
        event = asyncio.Event()
        arrived.append(event)
        if len(arrived) % hold_count == 0:
            for waiting in arrived[-hold_count:]:
                waiting.set()
        try:
            await asyncio.wait_for(event.wait(), 10)
        finally:
            state["open"] -= 1
        return PlainTextResponse("x" * 1000)

    async def now(request):
        return PlainTextResponse(f"{request.client.port}")

    async def moved(request):
        return RedirectResponse("/secret", status_code=302)

    async def secret(request):
        state["secret_hits"] += 1
        return PlainTextResponse("secret")

    app = Starlette(routes=[Route("/hold", hold), Route("/now", now), Route("/moved", moved),
                            Route("/secret", secret)])
    app.state.counts = state
    return app


def run_in_app(serve, api_key, body, **create) -> dict:
    """Run ``body(ctx.http)`` inside a rollout of a served app; what it returns."""
    seen: dict = {}

    async def rollout_fn(request, ctx):
        seen.update(await body(ctx.http))
        return {"metrics": {"episode_rewards": [1.0]}}

    config_overrides = {k: create.pop(k) for k in ("allow_link_local",) if k in create}
    app = serve(create_app(toy_config(rollout_fn, **config_overrides), api_keys=[api_key],
                           **create))
    resp = httpx.post(app.url + "/rollout", headers={"X-API-Key": api_key}, timeout=30,
                      json={"run_id": "outbound-1"})
    assert resp.status_code == 200, resp.text
    return seen


def test_calls_reuse_the_apps_connections(serve, api_key):
    upstream = serve(upstream_app())

    async def body(client):
        ports = [(await client.get(upstream.url + "/now")).text for _ in range(5)]
        streamed = []
        async with client.stream("GET", upstream.url + "/now") as answer:
            streamed = [chunk async for chunk in answer.aiter_text()]
        return {"ports": ports, "streamed": "".join(streamed)}

    seen = run_in_app(serve, api_key, body)
    assert len(set(seen["ports"])) == 1, seen  # one keep-alive connection, not five
    assert seen["streamed"] == seen["ports"][0]


def test_connections_are_bounded_by_the_rollouts_in_flight(serve, api_key):
    # Two rollouts in flight allowed: four calls at once get two connections, in two waves.
    upstream = serve(upstream_app(hold_count=2))

    async def body(client):
        answers = await asyncio.gather(*(client.get(upstream.url + "/hold") for _ in range(4)))
        return {"answers": [a.status_code for a in answers]}

    seen = run_in_app(serve, api_key, body, limits=RolloutLimits(max_in_flight=2))
    assert seen["answers"] == [200] * 4
    assert upstream.app.state.counts["most_open"] == 2


def test_a_redirect_is_an_answer_never_followed(serve, api_key):
    upstream = serve(upstream_app())

    async def body(client):
        answer = await client.get(upstream.url + "/moved")
        return {"status": answer.status_code, "location": answer.headers["location"]}

    seen = run_in_app(serve, api_key, body)
    assert seen == {"status": 302, "location": "/secret"}
    assert upstream.app.state.counts["secret_hits"] == 0


def test_the_policy_call_never_follows_a_redirect(serve, api_key):
    # A "policy" whose chat endpoint 302s to an internal endpoint (what an attacker hosts):
    # the rollout fails as the policy's (502, status and host named), the target never hit.
    upstream = serve(upstream_app())

    async def chat(request):
        return RedirectResponse(upstream.url + "/secret", status_code=302)

    policy = serve(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])]))

    async def rollout_fn(request, ctx):
        await call_policy(ctx, [{"role": "user", "content": "hi"}])
        return {"metrics": {"episode_rewards": [1.0]}}

    app = serve(create_app(toy_config(rollout_fn), api_keys=[api_key]))
    resp = httpx.post(app.url + "/rollout", headers={"X-API-Key": api_key}, timeout=20,
                      json={"run_id": "redirect-1", "env": {"seed": 1}, "policy": {
                          "config": {"model": "m", "inference_url": policy.url + "/v1"}}})
    assert resp.status_code == 502, resp.text
    error = resp.json()["detail"]["error"]
    assert error["code"] == "policy_failed" and error["kind"] == "policy"
    assert f"127.0.0.1:{policy.port}" in error["message"] and "302" in error["message"]
    assert "redirects are not followed" in error["message"]
    assert upstream.app.state.counts["secret_hits"] == 0


@pytest.fixture
def silent_then_hang_up():
    """A TCP server that reads a request, then says nothing for ``silence_s``, or (at
    /hang-up) closes the connection without a word."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.2)
    stop = threading.Event()

    def handle(conn):
        with conn:
            conn.settimeout(5)
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(65536)
            if b"/hang-up" not in request.split(b"\r\n", 1)[0]:
                stop.wait(5)

    def accept():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    worker = threading.Thread(target=accept, daemon=True)
    worker.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    worker.join(5)
    listener.close()


def test_failures_are_httpx_errors_an_app_already_catches(serve, api_key, silent_then_hang_up):
    async def body(client):
        seen = {}
        for name, url, timeout in (("refused", "http://127.0.0.1:9/", 5),
                                   ("silent", silent_then_hang_up + "/", 0.3),
                                   ("hang_up", silent_then_hang_up + "/hang-up", 5)):
            started = time.monotonic()
            try:
                await client.get(url, timeout=timeout)
                seen[name] = "answered"
            except httpx.HTTPError as exc:
                seen[name] = type(exc).__name__
            seen[name + "_s"] = time.monotonic() - started
        return seen

    seen = run_in_app(serve, api_key, body)
    assert (seen["refused"], seen["silent"], seen["hang_up"]) == (
        "ConnectError", "ReadTimeout", "RemoteProtocolError"), seen
    assert 0.3 <= seen["silent_s"] < 3, seen  # the request's own timeout, not the default


@pytest.mark.parametrize("url", ["http://169.254.169.254/latest/meta-data/",
                                 "http://[fe80::1]:9/", "http://[::ffff:169.254.0.1]:9/"])
def test_link_local_addresses_are_refused_on_ctx_http(serve, api_key, url):
    async def body(client):
        started = time.monotonic()
        try:
            await client.get(url, timeout=5)
            return {"outcome": "answered"}
        except httpx.ConnectError as exc:
            refused = refused_address(exc)
            return {"outcome": "refused" if refused else str(exc),
                    "seconds": time.monotonic() - started}

    seen = run_in_app(serve, api_key, body)
    assert seen["outcome"] == "refused", seen
    assert seen["seconds"] < 2  # refused before connecting, not timed out


def test_the_opt_out_connects_where_the_guard_refuses(serve, api_key):
    # fe80::1 without an interface cannot be connected to: the kernel says so at once, and no
    # packet leaves this machine. Guarded, the guard refuses it before the kernel is asked.
    async def body(client):
        try:
            await client.get("http://[fe80::1]:9/", timeout=5)
            return {"refused": "answered"}
        except httpx.ConnectError as exc:
            return {"refused": refused_address(exc) is not None}

    assert run_in_app(serve, api_key, body)["refused"] is True
    assert run_in_app(serve, api_key, body, allow_link_local=True)["refused"] is False


@pytest.fixture
def trusted_cert(tmp_path, monkeypatch):
    """A self-signed certificate that the kit's TLS context trusts (SSL_CERT_FILE)."""
    certfile, keyfile = self_signed_cert(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(certfile))
    client_ssl_context.cache_clear()
    yield certfile, keyfile
    monkeypatch.delenv("SSL_CERT_FILE")
    client_ssl_context.cache_clear()


def test_https_is_verified_with_the_kits_certificates(serve, api_key, tmp_path, trusted_cert):
    (tmp_path / "other").mkdir()
    other_cert, other_key = self_signed_cert(tmp_path / "other")

    async def body(client):
        seen = {}
        with SelfSignedTLSServer(*trusted_cert) as trusted:
            seen["https"] = (await client.get(trusted.url)).text
        with SelfSignedTLSServer(other_cert, other_key) as untrusted:
            try:
                await client.get(untrusted.url)
                seen["untrusted"] = "answered"
            except httpx.ConnectError as exc:
                seen["untrusted"] = str(exc)
        return seen

    seen = run_in_app(serve, api_key, body)
    assert seen["https"] == "{}"
    assert "CERTIFICATE_VERIFY_FAILED" in seen["untrusted"]


# -- credentials: a URL's user:password@ and a key or Authorization header --------------------

def auth_recorder() -> Starlette:
    """A "policy" that answers a chat completion and keeps each request's Authorization."""
    seen: list[str | None] = []

    async def chat(request):
        seen.append(request.headers.get("authorization"))
        return JSONResponse({"choices": [{"message": {"role": "assistant", "content": "ok"}}]})

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                            Route("/any", chat)])
    app.state.seen = seen
    return app


@pytest.fixture
def policy_app(serve, api_key):
    async def rollout(request, ctx):
        await call_policy(ctx, [{"role": "user", "content": "hi"}])
        return {"metrics": {"episode_rewards": [1.0]}}

    return serve(create_app(toy_config(rollout), api_keys=[api_key]))


def policy_rollout(server, key, inference_url, **config) -> httpx.Response:
    return httpx.post(server.url + "/rollout", headers={"X-API-Key": key}, timeout=20,
                      json={"run_id": "cred-1", "env": {"seed": 1}, "policy": {"config": {
                          "model": "m", "inference_url": inference_url, **config}}})


def test_the_policy_gets_the_urls_userinfo_or_the_key(serve, policy_app, api_key):
    upstream = serve(auth_recorder())
    with_userinfo = upstream.url.replace("http://", "http://alice:s3cret@") + "/v1?cid=c1"
    assert policy_rollout(policy_app, api_key, with_userinfo).status_code == 200
    assert policy_rollout(policy_app, api_key, upstream.url + "/v1",
                          api_key="sk-policy-1").status_code == 200
    assert upstream.app.state.seen == ["Basic " + base64.b64encode(b"alice:s3cret").decode(),
                                       "Bearer sk-policy-1"]


def test_userinfo_and_a_key_together_are_refused_naming_both(serve, policy_app, api_key):
    upstream = serve(auth_recorder())
    with_userinfo = upstream.url.replace("http://", "http://alice:s3cret@") + "/v1"
    resp = policy_rollout(policy_app, api_key, with_userinfo, api_key="sk-policy-1")
    assert resp.status_code == 422, resp.text
    error = resp.json()["detail"]["error"]
    assert error["code"] == "conflicting_policy_credentials"
    assert error["errors"][0]["path"] == "policy.config.inference_url"
    assert "user:password@" in error["message"] and "keep one" in error["hint"]
    assert "s3cret" not in resp.text and "sk-policy-1" not in resp.text
    assert upstream.app.state.seen == []  # nothing sent with half the credentials


def test_ctx_http_honours_userinfo_and_refuses_it_beside_a_header(serve, api_key):
    upstream = serve(auth_recorder())
    with_userinfo = upstream.url.replace("http://", "http://alice:s3cret@") + "/any"

    async def body(client):
        seen = {"alone": (await client.get(with_userinfo)).status_code}
        try:
            await client.get(with_userinfo, headers={"Authorization": "Bearer x"})
            seen["both"] = "sent"
        except httpx.InvalidURL as exc:
            seen["both"] = str(exc)
        return seen

    seen = run_in_app(serve, api_key, body)
    assert seen["alone"] == 200
    assert "user:password@" in seen["both"] and "s3cret" not in seen["both"]
    assert upstream.app.state.seen == ["Basic " + base64.b64encode(b"alice:s3cret").decode()]
