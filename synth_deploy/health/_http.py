"""A small blocking HTTP client for probes, on the standard library's `http.client`.

Why not httpx: `synth-deploy check` must answer in well under a second including process
start, and importing httpx (with httpcore, and trio/h2 when installed) costs ~0.6 s on a
typical dev machine, ten times the whole check of a local app. A probe needs little: one
request at a time, keep-alive per origin, a timeout on connect and on every read, redirects
followed (Modal answers long requests with 303), bodies capped. Failures are raised as
`RequestFailed` with a ``kind`` that `_diagnosis` turns into a fix.
"""

from __future__ import annotations

import http.client
import json as jsonlib
import socket
import ssl
from dataclasses import dataclass, field
from urllib.parse import urlencode, urljoin, urlsplit

from synth_deploy.tls import stdlib_ssl_context

MAX_BODY_BYTES = 5_000_000
MAX_REDIRECTS = 10
_REDIRECTS = {301, 302, 303, 307, 308}


class RequestFailed(Exception):
    """No HTTP answer. ``kind``: dns, refused, connect_timeout, connect, timeout, tls,
    protocol or redirects."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


@dataclass
class Response:
    status_code: int
    content: bytes
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    history: list[Response] = field(default_factory=list)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


class HTTPClient:
    """Sends requests with a timeout, reusing one connection per origin."""

    def __init__(self, *, timeout_s: float, ssl_context: ssl.SSLContext | None = None,
                 user_agent: str = "synth-deploy-check") -> None:
        self.timeout_s = timeout_s
        self.ssl_context = ssl_context
        self.user_agent = user_agent
        self._conns: dict[tuple[str, str, int], http.client.HTTPConnection] = {}

    def __enter__(self) -> HTTPClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()

    def request(self, method: str, url: str, *, headers: dict[str, str] | None = None,
                params: list[tuple[str, str]] | None = None, json: object = None,
                timeout: float | None = None) -> Response:
        """One request, redirects followed; raises `RequestFailed` when nothing answered."""
        url = _with_query(url, params)
        body = None if json is None else jsonlib.dumps(json).encode()
        headers = dict(headers or {})
        history: list[Response] = []
        origin = urlsplit(url)[:2]
        for _ in range(MAX_REDIRECTS + 1):
            response = self._send(method, url, headers, body, timeout or self.timeout_s)
            if response.status_code not in _REDIRECTS or "location" not in response.headers:
                response.history = history
                return response
            history.append(response)
            url = urljoin(url, response.headers["location"])
            method, body = _redirected(response.status_code, method, body)
            if urlsplit(url)[:2] != origin:
                # Never hand the key to another host a redirect points at.
                headers = {k: v for k, v in headers.items() if k.lower() != "x-api-key"}
        raise RequestFailed("redirects", f"more than {MAX_REDIRECTS} redirects")

    def _send(self, method: str, url: str, headers: dict[str, str], body: bytes | None,
              timeout: float) -> Response:
        key, path = _target(url)
        sent = {"User-Agent": self.user_agent, "Accept": "application/json", **headers}
        if body is not None:
            sent["Content-Type"] = "application/json"
        reused = key in self._conns
        conn = self._conn(key, timeout)
        try:
            conn.request(method, path, body=body, headers=sent)
            raw = conn.getresponse()
            content = raw.read(MAX_BODY_BYTES + 1)
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
            self._drop(key, conn)
            if reused and method == "GET":
                # The server closed an idle keep-alive connection: retry once on a fresh one.
                return self._send(method, url, headers, body, timeout)
            raise RequestFailed("protocol", f"the server closed the connection ({exc})") from None
        except TimeoutError:
            self._drop(key, conn)
            raise RequestFailed("timeout", f"no answer within {timeout:g}s") from None
        except (http.client.HTTPException, OSError) as exc:
            self._drop(key, conn)
            raise RequestFailed("protocol", f"not an HTTP answer: {exc}") from None
        if len(content) > MAX_BODY_BYTES or raw.will_close:
            self._drop(key, conn)
        else:
            self._conns[key] = conn
        return Response(raw.status, content[:MAX_BODY_BYTES], url,
                        {k.lower(): v for k, v in raw.getheaders()})

    def _conn(self, key: tuple[str, str, int], timeout: float) -> http.client.HTTPConnection:
        """The origin's kept-alive connection, else a new one; either waits ``timeout``."""
        conn = self._conns.get(key) or self._connect(key, timeout)
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def _connect(self, key: tuple[str, str, int], timeout: float) -> http.client.HTTPConnection:
        scheme, host, port = key
        if scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                host, port, timeout=timeout,
                context=self.ssl_context or stdlib_ssl_context())
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            conn.connect()
        except socket.gaierror as exc:
            raise RequestFailed("dns", f"{host} does not resolve ({exc.strerror})") from None
        except ConnectionRefusedError:
            raise RequestFailed("refused", f"connection refused at {host}:{port}") from None
        except TimeoutError:
            raise RequestFailed("connect_timeout",
                                f"no connection within {timeout:g}s") from None
        except ssl.SSLError as exc:
            reason = getattr(exc, "verify_message", None) or exc.reason or str(exc)
            raise RequestFailed("tls", f"TLS failed: {reason}") from None
        except OSError as exc:
            raise RequestFailed("connect", f"cannot connect to {host}:{port}: {exc}") from None
        return conn

    def _drop(self, key: tuple[str, str, int], conn: http.client.HTTPConnection) -> None:
        self._conns.pop(key, None)
        conn.close()


def _with_query(url: str, params: list[tuple[str, str]] | None) -> str:
    """``url`` with ``params`` added to any query it already has."""
    if not params:
        return url
    return url + ("&" if "?" in url else "?") + urlencode(params)


def _redirected(status: int, method: str, body: bytes | None) -> tuple[str, bytes | None]:
    """A 303, and a 301/302 after a POST, turn into a GET without a body, as browsers do."""
    if status == 303 or (status in (301, 302) and method == "POST"):
        return "GET", None
    return method, body


def _target(url: str) -> tuple[tuple[str, str, int], str]:
    """The connection key and request path of ``url``; `RequestFailed` for what cannot be
    followed."""
    try:  # a redirect's Location can be anything: "http://[::1", "http://h:port"...
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise RequestFailed("protocol", f"cannot follow to malformed URL {url!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RequestFailed("protocol", f"cannot follow to {url!r}")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return (parts.scheme, parts.hostname, port), path


__all__ = ["MAX_BODY_BYTES", "HTTPClient", "RequestFailed", "Response"]
