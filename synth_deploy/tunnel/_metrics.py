"""cloudflared's metrics server and log lines: what the tunnel's state is, read from outside.

The metrics server (``--metrics 127.0.0.1:PORT``) is the source of truth: ``/quicktunnel``
names the hostname, ``/ready`` says whether an edge connection is registered, ``/metrics``
counts requests. Logs are scanned only for what the endpoints cannot tell: why the process
exited before its metrics server came up (rate limiting, an unreachable edge).
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass

import httpx

QUICK_URL = re.compile(r"https://[a-z0-9-]+\.trycloudflare\.com")
# 429 on tunnel creation; old versions only say "failed to unmarshal quick Tunnel".
RATE_LIMITED = re.compile(r"429 Too Many Requests|status_code=\"?429|error code: 1015|"
                          r"failed to unmarshal quick Tunnel", re.IGNORECASE)
ERROR_LINE = re.compile(r"\b(ERR|error|failed|fatal)\b", re.IGNORECASE)

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(\S+)")
# Prometheus names cloudflared exports.
_COUNTERS = {
    "cloudflared_tunnel_total_requests": "requests",
    "cloudflared_tunnel_request_errors": "errors",
    "cloudflared_tunnel_concurrent_requests_per_tunnel": "in_flight",
    "cloudflared_tunnel_ha_connections": "connections",
}


@dataclass(frozen=True)
class Readiness:
    """``GET /ready``: ready once at least one edge connection is registered."""

    ready: bool
    connections: int
    status: int


class MetricsClient:
    """Reads one cloudflared's metrics server on the loopback interface."""

    def __init__(self, address: str, *, timeout_s: float = 1.0) -> None:
        self.address = address
        self.base_url = f"http://{address}"
        # trust_env=False: a user's HTTP(S)_PROXY must never carry loopback traffic.
        self._client = httpx.Client(base_url=self.base_url, timeout=timeout_s, trust_env=False)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> MetricsClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def quick_tunnel_hostname(self) -> str | None:
        """The quick tunnel's hostname, None before it is known (or for a named tunnel).

        Raises ``httpx.TransportError`` while the metrics server is not listening yet.
        """
        resp = self._client.get("/quicktunnel")
        if resp.status_code != 200:
            return None
        try:
            hostname = resp.json().get("hostname")
        except (ValueError, AttributeError):
            return None
        return hostname or None

    def readiness(self) -> Readiness:
        """Raises ``httpx.TransportError`` while the metrics server is not listening yet."""
        resp = self._client.get("/ready")
        try:
            connections = int(resp.json().get("readyConnections", 0))
        except (ValueError, AttributeError, TypeError):
            connections = 0
        return Readiness(resp.status_code == 200, connections, resp.status_code)

    def counters(self) -> dict[str, float]:
        """requests, errors, in_flight, connections from ``/metrics`` (missing ones omitted).

        No numbers, never an exception, when the server is unreachable or this client was
        closed: a status line may ask from another thread just as a restart retires it.
        """
        try:
            resp = self._client.get("/metrics")
        except (httpx.HTTPError, RuntimeError):  # RuntimeError: the client is closed
            return {}
        return parse_counters(resp.text) if resp.status_code == 200 else {}


def parse_counters(text: str) -> dict[str, float]:
    """Sum the samples of the counters we show, across label sets."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or (key := _COUNTERS.get(match.group(1))) is None:
            continue
        try:
            totals[key] = totals.get(key, 0.0) + float(match.group(2))
        except ValueError:
            continue
    return totals


def quick_url_in(lines: list[str]) -> str | None:
    """The https://….trycloudflare.com URL from cloudflared's banner, if logged."""
    for line in reversed(lines):
        if match := QUICK_URL.search(line):
            return match.group(0)
    return None


def rate_limited(lines: list[str]) -> bool:
    return any(RATE_LIMITED.search(line) for line in lines)


def last_error(lines: list[str]) -> str | None:
    """The last line that looks like an error, for a one-line failure message."""
    for line in reversed(lines):
        if ERROR_LINE.search(line):
            return line.strip()
    return lines[-1].strip() if lines else None


def free_loopback_port() -> int:
    """A port free on 127.0.0.1 right now (cloudflared needs an address, not a socket)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


__all__ = ["MetricsClient", "Readiness", "free_loopback_port", "parse_counters"]
