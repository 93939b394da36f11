"""What a hostile client gets from a served app (real uvicorn on loopback): a deeply nested
document is malformed JSON on every route and over the WebSocket, a WebSocket message is
capped as a request body is, and neither a keyless nor a malformed request writes more than a
bounded line to the server's log."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

import httpx
import pytest
from standins.openenv_client import WSEnvClient
from toy_apps import env_config
from wsproto.events import Message

from synth_deploy.serving import create_app


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.fixture
def env_server(serve, api_key):
    return serve(create_app(env_config(), api_keys=[api_key]))


@pytest.mark.parametrize("path", ["/openenv/reset", "/openenv/step", "/rollout"])
@pytest.mark.parametrize("levels", [1_000, 100_000])
def test_deeply_nested_json_is_a_422_on_every_route(env_server, api_key, path, levels):
    body = '{"action": ' + deep(levels) + "}"
    resp = httpx.post(env_server.url + path, content=body, timeout=10,
                      headers={"X-API-Key": api_key, "content-type": "application/json"})
    assert resp.status_code == 422, resp.text
    assert resp.json()["detail"]["error"]["code"] == "invalid_json"


def test_deeply_nested_json_rpc_is_an_invalid_request(env_server):
    resp = httpx.post(env_server.url + "/openenv/mcp", content=deep(100_000), timeout=10)
    assert resp.status_code == 200
    assert resp.json()["error"]["code"] == -32600


def test_a_deeply_nested_frame_is_invalid_json_and_the_session_lives_on(env_server, api_key):
    with WSEnvClient(env_server.url + "/openenv", headers={"X-API-Key": api_key}) as env:
        env.reset(seed=1)
        for levels in (1_000, 5_000, 200_000):
            env.sock.sendall(env.ws.send(Message(data=deep(levels))))
            answer = env.receive()
            assert answer["type"] == "error" and answer["data"]["code"] == "INVALID_JSON"
        assert env.step({"n": 1})["observation"]["total"] == 1


def test_a_websocket_message_is_capped_as_a_body_is(serve, api_key):
    limit = 64 * 1024
    server = serve(create_app(env_config(max_body_bytes=limit), api_keys=[api_key]))
    with WSEnvClient(server.url + "/openenv", headers={"X-API-Key": api_key}) as env:
        env.reset(seed=1)
        # Refused as the bytes arrive, before the message ends: nothing holds it whole.
        env.sock.sendall(env.ws.send(Message(data="x" * (limit + 1), message_finished=False)))
        with pytest.raises(ConnectionError, match="1009"):
            env.receive()
    with WSEnvClient(server.url + "/openenv", headers={"X-API-Key": api_key}) as env:
        # just under the cap is a message like any other
        env.reset(seed=1)
        env.send({"type": "step", "data": {"n": 1, "pad": "x" * (limit - 100)}})
        assert env.receive()["data"]["observation"]["total"] == 1


async def websocket_session(app, api_key: str, texts: list[str]) -> list[dict]:
    """What ``app`` sends over a WebSocket that delivers ``texts`` whole, as an ASGI server
    other than uvicorn may (Modal's front end runs a deployed app)."""
    incoming = [{"type": "websocket.connect"}] + [
        {"type": "websocket.receive", "text": text} for text in texts]
    sent: list[dict] = []

    async def receive() -> dict:
        if incoming:
            return incoming.pop(0)
        await asyncio.sleep(3600)  # the client waits for an answer

    async def send(message: dict) -> None:
        sent.append(message)
        if message["type"] == "websocket.close":
            raise asyncio.CancelledError  # the server hung up: the session is over

    scope = {"type": "websocket", "path": "/openenv/ws", "raw_path": b"/openenv/ws",
             "query_string": b"", "headers": [(b"x-api-key", api_key.encode())],
             "scheme": "ws", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 5000),
             "subprotocols": [], "asgi": {"version": "3.0"}, "root_path": ""}
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(app(scope, receive, send), 10)
    return sent


def test_the_wire_caps_messages_where_another_server_runs_the_app(api_key):
    limit = 16 * 1024
    app = create_app(env_config(max_body_bytes=limit), api_keys=[api_key])
    sent = asyncio.run(websocket_session(app, api_key, [
        '{"type": "reset", "data": {"seed": 1}}',
        '{"type": "step", "data": {"pad": "' + "x" * limit + '"}}']))
    assert [m["type"] for m in sent] == ["websocket.accept", "websocket.send",
                                         "websocket.close"]
    assert json.loads(sent[1]["text"])["type"] == "observation"
    assert sent[2]["code"] == 1009


@pytest.fixture
def server_log(caplog):
    with caplog.at_level(logging.INFO, logger="uvicorn"):
        yield caplog
