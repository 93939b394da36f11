"""Every secret the kit knows is masked wherever text leaves (issue 50, item 5): an app's
exception that quotes its request's inference_url (a password, a ``?api_key=``) or a nested
credential, and a policy's error body that echoes them, reach neither the client's 500, the
server's log, the stored session, `traces show`, the viewer API nor the spans. Real uvicorn,
a real trace file, the real CLI in-process."""

from __future__ import annotations

import base64
import dataclasses
import json
import logging

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from typer.testing import CliRunner

from synth_deploy.cli import app as cli
from synth_deploy.env import known_secrets
from synth_deploy.serving import create_app
from synth_deploy.tracing import open_trace_store
from synth_deploy.viewer import create_viewer_app

PASSWORD = "pw-Hunter2-url"
QUERY_KEY = "qk-Query-7731"
NESTED = "nested-Bearer-5521"
SECRETS = (PASSWORD, QUERY_KEY, NESTED,
           base64.b64encode(f"user:{PASSWORD}".encode()).decode())


def policy_config(url: str) -> dict:
    return {"model": "m", "inference_url": f"http://user:{PASSWORD}@{url}?api_key={QUERY_KEY}",
            "extra": {"headers": {"Authorization": f"Bearer {NESTED}"}}}


def test_known_secrets_finds_them_at_any_depth_and_in_urls():
    found = known_secrets(policy_config("127.0.0.1:9/v1"))
    assert set(SECRETS) <= set(found), found
    assert known_secrets({"model": "m", "max_tokens": 5, "url": "http://h/x?seed=3"}) == []


def leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


@pytest.fixture
def quoting_app(math_config):
    async def failing(request, ctx):
        config = request.policy.config
        raise RuntimeError(f"could not reach {config['inference_url']} with "
                           f"{config['extra']['headers']['Authorization']}")

    return dataclasses.replace(math_config, rollout=failing)


def test_an_exception_quoting_the_request_is_masked_everywhere_it_goes(
        tmp_path, serve, quoting_app, api_key, caplog):
    db = tmp_path / "traces.db"
    body = {"run_id": "leaky", "env": {"seed": 1},
            "policy": {"config": policy_config("127.0.0.1:9/v1")}}
    with caplog.at_level(logging.ERROR, logger="synth_deploy.taskapp"), \
            open_trace_store(str(db)) as store:
        server = serve(create_app(quoting_app, api_keys=[api_key], trace_store=store))
        resp = httpx.post(server.url + "/rollout", json=body, timeout=30,
                          headers={"X-API-Key": api_key})
        assert resp.status_code == 500
        [summary] = store.list_sessions(limit=None)
        stored = store.get_session(summary.session_id)
    assert "could not reach http://****@127.0.0.1:9/v1" in resp.text
    assert not leaks(resp.text) and not leaks(caplog.text), caplog.text
    assert "could not reach" in stored.metadata["error"]["message"]
    assert not leaks(json.dumps(stored.to_dict()))
    for args in (["--json"], []):
        shown = CliRunner().invoke(cli, ["traces", "show", summary.session_id, "--trace-db",
                                         str(db), *args], env={"SYNTH_TRACES_DB": ""})
        assert shown.exit_code == 0 and "could not reach" in shown.output, shown.output
        assert not leaks(shown.output), shown.output
    with open_trace_store(str(db), read_only=True) as store:
        viewer = serve(create_viewer_app(store))
        page = httpx.get(viewer.url + f"/api/sessions/{summary.session_id}", timeout=10)
    assert page.status_code == 200 and "could not reach" in page.text
    assert not leaks(page.text)


def test_a_policy_echoing_its_credentials_is_masked_in_the_log(serve, math_config, api_key,
                                                                caplog):
    async def echo(request):  # an upstream that quotes what it was sent in its error
        return JSONResponse({"error": f"bad key: query {request.url.query}, authorization "
                             f"{request.headers.get('authorization')}"}, status_code=401)

    upstream = serve(Starlette(routes=[Route("/v1/chat/completions", echo,
                                             methods=["POST"])]))
    server = serve(create_app(math_config, api_keys=[api_key]))
    url = upstream.url.removeprefix("http://") + "/v1"
    with caplog.at_level(logging.INFO, logger="synth_deploy.taskapp"):
        resp = httpx.post(server.url + "/rollout", timeout=30, headers={"X-API-Key": api_key},
                          json={"run_id": "echoed", "env": {"seed": 1},
                                "policy": {"config": policy_config(url)}})
    assert resp.status_code == 502, resp.text
    assert not leaks(resp.text) and not leaks(caplog.text), caplog.text


def test_a_served_rollout_with_credentials_in_its_url_is_shown_without_them(
        tmp_path, serve, math_config, mock_policy, api_key):
    db = tmp_path / "traces.db"
    url = mock_policy.url.removeprefix("http://") + "/v1"
    with open_trace_store(str(db)) as store:
        server = serve(create_app(math_config, api_keys=[api_key], trace_store=store))
        resp = httpx.post(server.url + "/rollout", timeout=30, headers={"X-API-Key": api_key},
                          json={"run_id": "fine", "env": {"seed": 1},
                                "policy": {"config": policy_config(url)}})
        assert resp.status_code == 200, resp.text
        [summary] = store.list_sessions(limit=None)
    for args in (["--json"], []):
        shown = CliRunner().invoke(cli, ["traces", "show", summary.session_id, "--trace-db",
                                         str(db), *args], env={"SYNTH_TRACES_DB": ""})
        assert shown.exit_code == 0, shown.output
        assert not leaks(shown.output) and "user:" not in shown.output, shown.output
