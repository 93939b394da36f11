"""Servers that really misbehave, for the health checker's tests (loopback only).

- ASGI wrappers around a real task app: auth switched off, synth-ai's 400-with-key-prefix
  auth, a synth-ai-style app (its open ``/health``, its auth elsewhere), a Modal-style 303
  to a result URL, a cold start (503 for a while), slow answers, a /task_info whose answer
  breaks the schema.
- ASGI apps that answer one status everywhere (Cloudflare's 530, gateways' 502/503/504).
- Raw socket servers: one that accepts connections and never answers (a stall), one that
  drips its headers a byte at a time, and a TLS server with a self-signed certificate
  generated here.
Serve the ASGI ones with `BackgroundServer` (the ``serve`` fixture); the socket servers are
context managers that stop their thread and close every socket on exit.
"""

from __future__ import annotations

import asyncio
import datetime
import hmac
import itertools
import json
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any

Scope = dict[str, Any]

CLOUDFLARE_530_BODY = (
    "<!DOCTYPE html><html><head><title>Cloudflare Tunnel error | trycloudflare.com | "
    "Cloudflare</title></head><body><h1>Error 1033</h1><p>Cloudflare Tunnel error</p>"
    "<p>error code: 1033</p></body></html>"
)


async def _send_json(send: Any, status: int, payload: Any, headers: list | None = None) -> None:
    body = json.dumps(payload).encode()
    await _send_raw(send, status, body, [(b"content-type", b"application/json"), *(headers or [])])


async def _send_raw(send: Any, status: int, body: bytes, headers: list) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


async def _drain(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _capture(app: Any, scope: Scope, body: bytes) -> tuple[int, list, bytes]:
    """Run ``app`` on one request and collect its whole response."""
    sent = False
    start: dict[str, Any] = {}
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.sleep(3600)
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
        else:
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return start["status"], list(start.get("headers", [])), b"".join(chunks)


def status_app(status: int, body: str = "", content_type: str = "text/plain") -> Any:
    """Answers every request with ``status`` (a gateway in front of a dead app)."""

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        await _drain(receive)
        await _send_raw(send, status, body.encode(), [(b"content-type", content_type.encode())])

    return app


def cloudflare_530_app() -> Any:
    """What a trycloudflare.com hostname answers when cloudflared's origin is gone."""
    return status_app(530, CLOUDFLARE_530_BODY, "text/html; charset=UTF-8")


def auth_off(app: Any, key: str) -> Any:
    """The app with auth effectively off: every request reaches it as if it held the key."""

    async def wrapper(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = [(k, v) for k, v in scope["headers"]
                       if k not in (b"x-api-key", b"x-api-keys", b"authorization")]
            scope = {**scope, "headers": [*headers, (b"x-api-key", key.encode())]}
        await app(scope, receive, send)

    return wrapper


def synth_ai_auth(app: Any, key: str) -> Any:
    """synth-ai's auth in front of ``app`` (which accepts ``key``): a missing or wrong key gets
    HTTP 400 with the first 15 characters of the valid key in the body."""
    open_paths = {"/", "/docs"}

    async def wrapper(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in open_paths:
            await app(scope, receive, send)
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        candidates = [headers.get("x-api-key", "")]
        candidates += headers.get("x-api-keys", "").split(",")
        auth = headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            candidates.append(auth[7:])
        candidates = [c.strip() for c in candidates if c.strip()]
        if not any(hmac.compare_digest(c.encode(), key.encode()) for c in candidates):
            await _drain(receive)
            await _send_json(send, 400, {"detail": {"error": {
                "code": "unauthorised", "message": "API key missing or invalid",
                "allowed_first15": [key[:15]], "allowed_count": 1,
                "got_first15": [c[:15] for c in candidates],
                "got_lens": [len(c) for c in candidates]}}})
            return
        await app(scope, receive, send)

    return wrapper


def synth_ai_style(app: Any, key: str, *, health_without_key: str = "authorized") -> Any:
    """``app`` (which accepts ``key``) as synth-ai 0.4.4's task apps serve: every route wants
    the key (`synth_ai_auth`) but ``/`` and the health routes of its `add_health_endpoints`,
    which answer anyone 200 ``{"status": "healthy", "authorized": ...}``. Without the key:
    ``health_without_key="authorized"`` says ``authorized: true`` all the same (as an app seen
    in the wild did), ``"prefix"`` says false with ``expected_api_key_prefix``, half the key
    (as synth-ai's own demo apps do)."""
    guarded = synth_ai_auth(app, key)

    async def wrapper(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] not in ("/health", "/health/rollout"):
            await guarded(scope, receive, send)
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        sent = [headers.get("x-api-key", ""), *headers.get("x-api-keys", "").split(","),
                headers.get("authorization", "").removeprefix("Bearer ")]
        authorized = any(hmac.compare_digest(c.strip().encode(), key.encode()) for c in sent)
        await _drain(receive)
        body: dict[str, Any] = {"status": "healthy", "authorized": True}
        if not authorized and health_without_key == "prefix":
            body = {"status": "healthy", "authorized": False,
                    "expected_api_key_prefix": key[: max(1, len(key) // 2)]}
        await _send_json(send, 200, body)

    return wrapper


def modal_303(app: Any) -> Any:
    """Modal's long-request behaviour for every request: run it, answer 303 to a result URL,
    and serve the stored result there (once)."""
    results: dict[str, tuple[int, list, bytes]] = {}
    ids = itertools.count(1)

    async def wrapper(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        if scope["path"].startswith("/__modal_result/"):
            await _drain(receive)
            stored = results.pop(scope["path"].rsplit("/", 1)[-1], None)
            if stored is None:
                await _send_json(send, 404, {"detail": "no such result"})
                return
            await _send_raw(send, stored[0], stored[2],
                            [h for h in stored[1] if h[0].lower() != b"content-length"])
            return
        body = await _drain(receive)
        result_id = f"fc-{next(ids)}"
        results[result_id] = await _capture(app, scope, body)
        await _send_raw(send, 303, b"", [(b"location", f"/__modal_result/{result_id}".encode())])

    return wrapper


def cold_start(app: Any, unavailable_s: float) -> Any:
    """503 (as Modal answers while a container starts) until ``unavailable_s`` have passed."""
    ready_at = time.monotonic() + unavailable_s

    async def wrapper(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and time.monotonic() < ready_at:
            await _drain(receive)
            await _send_raw(send, 503, b"Service Unavailable", [(b"content-type", b"text/plain")])
            return
        await app(scope, receive, send)

    return wrapper


def slow(app: Any, delay_s: float) -> Any:
    """Every answer delayed by ``delay_s`` (an overloaded app)."""

    async def wrapper(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await asyncio.sleep(delay_s)
        await app(scope, receive, send)

    return wrapper


def rewrite_task_info(app: Any, mutate: Any) -> Any:
    """``/task_info?seed=...`` answers of ``app`` passed through ``mutate(item)`` (each item)."""

    async def wrapper(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/task_info" \
                or b"seed" not in scope.get("query_string", b""):
            await app(scope, receive, send)
            return
        status, headers, body = await _capture(app, scope, await _drain(receive))
        if status == 200:
            data = json.loads(body)
            for item in data if isinstance(data, list) else [data]:
                mutate(item)
            body = json.dumps(data).encode()
        await _send_raw(send, status, body,
                        [h for h in headers if h[0].lower() != b"content-length"])

    return wrapper


def break_task_info(item: dict[str, Any]) -> None:
    """Drop the required task.name and give limits.max_turns a string."""
    item["task"].pop("name", None)
    item.setdefault("limits", {})["max_turns"] = "many"


def closed_port() -> int:
    """A loopback port nothing listens on (bound, read back, closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _SocketServer:
    """A listening socket on 127.0.0.1 served by one thread; every socket closed on stop."""

    def __init__(self) -> None:
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self._listener.settimeout(0.05)
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> _SocketServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        for conn in self._conns:
            conn.close()
        self._listener.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._conns.append(conn)
            self.handle(conn)

    def handle(self, conn: socket.socket) -> None:
        raise NotImplementedError


class StallServer(_SocketServer):
    """Accepts connections and never answers (a hung app behind an open port)."""

    def handle(self, conn: socket.socket) -> None:
        pass  # keep the connection open and silent until the server stops


class HeaderDripServer(_SocketServer):
    """Answers a status line at once, then its headers a byte every ``every_s`` seconds (a
    proxy or server that never finishes an answer, yet never goes quiet long enough for a
    read timeout)."""

    every_s = 0.05

    def handle(self, conn: socket.socket) -> None:
        threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        try:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            for byte in b"x-padding: " + b"y" * 10_000:
                if self._stop.wait(self.every_s):
                    return
                conn.sendall(bytes([byte]))
        except OSError:
            return


class SelfSignedTLSServer(_SocketServer):
    """TLS with a self-signed certificate, then a minimal HTTP 200 for clients that trust it."""

    def __init__(self, certfile: Path, keyfile: Path) -> None:
        super().__init__()
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.load_cert_chain(certfile, keyfile)
        self.handshakes_failed = 0

    def handle(self, conn: socket.socket) -> None:
        conn.settimeout(2)
        try:
            with self._context.wrap_socket(conn, server_side=True) as tls:
                tls.recv(65536)
                tls.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n"
                            b"{}")
        except (ssl.SSLError, OSError):
            self.handshakes_failed += 1

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"


def self_signed_cert(directory: Path, host: str = "127.0.0.1") -> tuple[Path, Path]:
    """A fresh self-signed certificate (and its key) for ``host``, valid for a day."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(
                ipaddress.ip_address(host))]), critical=False)
            .sign(key, hashes.SHA256()))
    certfile, keyfile = directory / "cert.pem", directory / "key.pem"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return certfile, keyfile
