"""What a hostile client gets from a served app (real uvicorn on loopback): a deeply nested
document is malformed JSON on every route and over the WebSocket, a WebSocket message is
capped as a request body is, and neither a keyless nor a malformed request writes more than a
bounded line to the server's log."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import subprocess
import sys

import httpx
import pytest
from processes import clean_env, free_port, wait_until_up
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


ENV_APP = '''
from synth_deploy.taskapp import Step, TaskApp, function_tool


class Counter:
    tool = function_tool("add", "Add one.", {"type": "object"})

    def reset(self, seed, *, episode_id, config):
        self.total = 0
        return {"total": 0}

    def step(self, action):
        self.total += 1
        return Step({"total": self.total}, reward=0.0, done=False)


task_app = TaskApp("counter", name="Counter", description="Counts.")
task_app.environment(Counter)
'''


def served_log(tmp_path, api_key, *flags, clients) -> str:
    """What `synth-deploy serve` (a child process) prints while ``clients(url)`` runs."""
    (tmp_path / "counter_app.py").write_text(ENV_APP)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "synth_deploy.cli", "serve", "counter_app.py", "--port",
         str(port), "--no-trace", *flags], cwd=tmp_path,
        env=clean_env(ENVIRONMENT_API_KEY=api_key), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, proc)
        clients(url)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
    return out + err


def raw_exchange(url: str, request: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(request)
        answer = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                answer += chunk
    return answer


def handshake(path: str, *headers: str) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1", "Upgrade: websocket",
             "Connection: Upgrade", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
             "Sec-WebSocket-Version: 13", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_keyless_and_malformed_clients_write_next_to_nothing_to_the_log(tmp_path, api_key):
    huge = "q=" + "A" * 100_000

    def clients(url):
        for _ in range(20):
            # A handshake past websockets' 8 KiB line limit is refused before the app.
            assert b" 414 " in raw_exchange(url, handshake(f"/openenv/ws?{huge}"))
            assert b" 401 " in raw_exchange(url, handshake(f"/openenv/ws?{huge[:4000]}"))
            assert b" 403 " in raw_exchange(url, handshake(f"/openenv/ws?{huge[:4000]}",
                                                           "X-API-Key: sk_env_wrong"))
            raw_exchange(url, b"NOT HTTP AT ALL\r\n\r\n")
        env = WSEnvClient(url + "/openenv", headers={"X-API-Key": api_key})
        env.path += f"?api_key={api_key}"  # a client that puts its key in the query too
        with env:
            env.reset(seed=1)

    log = served_log(tmp_path, api_key, clients=clients)
    assert "AAAA" not in log and api_key not in log
    # Handshakes and a session's opening and closing are access-log lines: the access log
    # is off (a scaling run opens thousands).
    assert "WebSocket" not in log
    assert "connection open" not in log and "connection closed" not in log, log
    assert log.count("Invalid HTTP request received") == 1, log
    assert len(log) < 4_000, log


def test_the_access_log_shows_paths_without_their_query(tmp_path, api_key):
    def clients(url):
        assert httpx.get(url + f"/health?api_key={api_key}",
                         headers={"X-API-Key": api_key}).status_code == 200
        raw_exchange(url, handshake("/openenv/ws?q=" + "A" * 5_000))
        env = WSEnvClient(url + "/openenv", headers={"X-API-Key": api_key})
        env.path += f"?api_key={api_key}"
        with env:
            env.reset(seed=1)
        long_path = "/" + "p" * 5_000
        assert httpx.get(url + long_path, headers={"X-API-Key": api_key}).status_code == 404
        # Refused by the protocol without the key, and logged as uvicorn logs a request.
        assert httpx.post(url + f"/rollout?api_key={api_key}x").status_code == 401

    log = served_log(tmp_path, api_key, "--access-log", clients=clients)
    assert '"GET /health?… HTTP/1.1" 200' in log, log
    assert '"WebSocket /openenv/ws?…" 401' in log and '"WebSocket /openenv/ws?…" [accepted]' \
        in log, log
    assert "/" + "p" * 199 + "…" in log and "p" * 200 not in log
    assert '"POST /rollout?… HTTP/1.1" 401' in log, log
    assert api_key not in log and "AAAA" not in log
