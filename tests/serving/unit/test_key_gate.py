"""The key gate's two answers, before the app (`raw_refusal`, what the kit's protocol sends)
and at its entry (`refusal`): the same verdict for every path, routed or not, and for
OpenEnv's keyed base URL none before the app, which moves its key into a header first."""

from __future__ import annotations

import pytest

from synth_deploy.serving import ApiKeyAuth, KeyGate

GATE = KeyGate(ApiKeyAuth(["k1"]), [("GET", "/"), ("HEAD", "/")],
               unkeyed_prefix="/openenv/key/")
KEYED = [(b"x-api-key", b"k1")]


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/containers/rollouts/abc"), ("POST", "/containers/rollouts/abc/terminate"),
    ("GET", "/nope"), ("DELETE", "/rollout"), ("POST", "/"), ("GET", "/openenv/ws")])
def test_every_path_but_the_public_ones_is_refused_without_the_key(method, path):
    head, body = GATE.raw_refusal(method.encode(), path.encode(), [])
    assert head.startswith(b"HTTP/1.1 401 ") and b"missing_api_key" in body
    wrong = GATE.raw_refusal(method.encode(), path.encode(), [(b"x-api-key", b"nope")])
    assert wrong[0].startswith(b"HTTP/1.1 403 ")
    scope = {"type": "http", "method": method, "path": path, "headers": []}
    assert GATE.refusal(scope).status_code == 401
    assert GATE.raw_refusal(method.encode(), path.encode(), KEYED) is None
    assert GATE.refusal({**scope, "headers": KEYED}) is None


def test_the_public_routes_and_the_keyed_base_url_pass_to_the_app():
    assert GATE.raw_refusal(b"GET", b"/", []) is None
    assert GATE.raw_refusal(b"HEAD", b"/", []) is None
    assert GATE.refusal({"type": "http", "method": "GET", "path": "/", "headers": []}) is None
    assert GATE.raw_refusal(b"GET", b"/openenv/key/k1/ws", []) is None
