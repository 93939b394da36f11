"""The auth matrix on every authenticated endpoint, against real uvicorn: served by the kit's
own protocol (which refuses a keyless request before the app runs) and as the bare ASGI app
Modal serves (where the app's own key gate is all there is)."""

from __future__ import annotations

import logging

import httpx
import pytest
from toy_apps import proxy_config, toy_config

from synth_deploy.serving import ApiKeyAuth, create_app

ROLLOUT = {"run_id": "auth-1", "env": {"seed": 3}}
BODIES = {"/rollout": ROLLOUT, "/done": {}}  # any other POST takes a chat request
CHAT = {"model": "m", "messages": []}


def declared_routes(app) -> list[tuple[str, str, object, bool]]:
    """(method, path, body, public) for every route the app declares: a new endpoint is
    walked here without being listed."""
    found = []
    for route in app.routes:
        declaration = route.declaration
        for method in declaration.method_list:
            found.append((method, route.path, BODIES.get(route.path, CHAT) if method == "POST"
                          else None, declaration.public))
    return found


# The proxy's upstream is a closed port: only auth is under test here.
APP_ROUTES = declared_routes(create_app(proxy_config("http://127.0.0.1:9"), api_keys=["k"]))
PROTECTED = [(m, p, b) for m, p, b, public in APP_ROUTES if not public]
# Answered 200 with the key: the protocol's own endpoints (a proxy's upstream is closed;
# synth-containers' routes take their own bodies: test_containers_contract.py).
PROTOCOL = [(m, p, b) for m, p, b in PROTECTED
            if not p.startswith(("/proxy/", "/containers/"))] + [
    ("GET", "/task_info?seed=1", None)]


def test_every_route_is_declared_and_only_the_liveness_probe_is_public():
    assert {(m, p) for m, p, _, public in APP_ROUTES if public} == {("GET", "/"), ("HEAD", "/")}
    assert {p for _, p, _ in PROTECTED} >= {"/health", "/info", "/task_info", "/rollout",
                                            "/done", "/openapi.json",
                                            "/proxy/v1/chat/completions",
                                            "/proxy/groq/v1/chat/completions"}


@pytest.fixture(params=["protocol", "bare_asgi"])
def server(request, serve, serve_bare, api_key):
    app = create_app(proxy_config("http://127.0.0.1:9"), api_keys=[api_key, "alias-key-2"])
    return (serve if request.param == "protocol" else serve_bare)(app)


# Paths no route has, and methods no route takes: a keyless client learns nothing of either.
UNROUTED = [("GET", "/nope"), ("DELETE", "/rollout"), ("GET", "/containers/rollouts/x"),
            ("POST", "/"), ("OPTIONS", "/health"), ("PUT", "/openenv/state"),
            ("GET", "/admin/../health")]


@pytest.mark.parametrize(("method", "path"), UNROUTED)
def test_a_keyless_request_for_any_path_but_the_public_ones_is_401(server, method, path):
    resp = httpx.request(method, server.url + path, timeout=10)
    assert resp.status_code == 401, resp.text
    assert resp.json()["detail"]["error"]["code"] == "missing_api_key"


def call(server, method, path, body, headers=None):
    return httpx.request(method, server.url + path, json=body, headers=headers or {}, timeout=10)


@pytest.mark.parametrize(("method", "path", "body"), PROTECTED)
def test_missing_key_is_401_and_wrong_key_is_403(server, api_key, method, path, body):
    missing = call(server, method, path, body)
    assert missing.status_code == 401
    assert missing.json()["detail"]["error"]["code"] == "missing_api_key"
    wrong = call(server, method, path, body, {"X-API-Key": "not-the-key"})
    assert wrong.status_code == 403
    assert wrong.json()["detail"]["error"]["code"] == "invalid_api_key"
    for resp in (missing, wrong):
        assert api_key not in resp.text and api_key[:8] not in resp.text
        assert str(len(api_key)) not in resp.text


@pytest.mark.parametrize(("method", "path", "body"), PROTOCOL)
def test_right_key_passes(server, api_key, method, path, body):
    assert call(server, method, path, body, {"X-API-Key": api_key}).status_code == 200


@pytest.mark.parametrize("headers", [
    {"X-API-Key": "alias-key-2"},
    {"Authorization": "Bearer {key}"},
    {"X-API-Keys": "wrong-one, {key}"},
    {"X-API-Key": "wrong-one", "Authorization": "Bearer {key}"},
])
def test_every_header_form_and_alias_is_accepted(server, api_key, headers):
    headers = {k: v.format(key=api_key) for k, v in headers.items()}
    assert call(server, "GET", "/health", None, headers).status_code == 200


@pytest.mark.parametrize(("sent", "status"), [
    ({"X-API-Key": "k2"}, None),
    ({"Authorization": "Bearer k1"}, None),
    ({"X-API-Keys": "nope, k2"}, None),
    ({"X-API-Key": "nope"}, 403),
    ({}, 401),
])
def test_a_key_check_reads_a_mapping_starlette_headers_and_raw_asgi_pairs_alike(sent, status):
    # The served app passes the scope's raw pairs; an app's own router may pass either
    # mapping (the public ApiKeyAuth): every form gives the same verdict.
    from starlette.datastructures import Headers

    auth = ApiKeyAuth(["k1", "k2"])
    raw = [(k.lower().encode(), v.encode()) for k, v in sent.items()]
    verdicts = {form: auth.check(headers) for form, headers in [
        ("mapping", sent), ("starlette", Headers(raw=raw)), ("raw", raw)]}
    assert {form: v and v.status for form, v in verdicts.items()} == dict.fromkeys(
        verdicts, status)


def test_root_stays_open(server):
    resp = httpx.get(server.url + "/")
    assert resp.status_code == 200 and resp.json() == {"status": "ok", "service": "toy"}
    assert httpx.head(server.url + "/").status_code == 200


def test_no_key_configured_is_503_with_the_fix(serve):
    server = serve(create_app(toy_config(), api_keys=[]))
    for method, path, body in PROTOCOL:
        resp = call(server, method, path, body, {"X-API-Key": "anything"})
        assert resp.status_code == 503
        error = resp.json()["detail"]["error"]
        assert error["code"] == "missing_environment_api_key"
        assert "synth-deploy setup" in error["message"]


def test_key_never_reaches_the_logs(server, api_key, caplog):
    caplog.set_level(logging.DEBUG)
    for headers in ({}, {"X-API-Key": "wrong"}, {"X-API-Key": api_key}):
        call(server, "POST", "/rollout", ROLLOUT, headers)
    assert api_key not in caplog.text and api_key[:8] not in caplog.text
