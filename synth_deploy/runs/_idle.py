"""Idle connections: does a request on a keep-alive connection that sat idle survive?

Trainers keep a pool of connections to the task app. Between two batches a connection may sit
idle for longer than a proxy, a load balancer or a NAT on the path keeps it; if the path
forgets it without telling the client, the next rollout sent on it dies (a reset, "server
disconnected") and, at 300–500 concurrent rollouts, silently zeroes rewards. This probe sends a
rollout, holds the connection idle for ``idle_s``, and sends another on the same pool.

A server that closes an idle connection cleanly is fine: the client sees the close and opens
a new one (reported as "reconnected"). A path that drops it silently is not.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from synth_deploy.env import redact
from synth_deploy.runs._rollouts import transport_error
from synth_deploy.tls import client_ssl_context

# Common idle timeouts: uvicorn and Node 5 s, AWS ALB 60 s, nginx 75 s.
LOCAL_IDLE_S = 6.0  # loopback: the server's own keep-alive (uvicorn: 5 s) is all there is
REMOTE_IDLE_S = 80.0  # past ALB's 60 s and nginx's 75 s


@dataclass
class IdleResult:
    """Two rollouts on one keep-alive pool, ``idle_s`` apart."""

    idle_s: float
    statuses: list[int] = field(default_factory=list)  # HTTP answers received, in order
    reconnected: bool | None = None  # the second went out on a new connection
    error: str | None = None  # the request that got no answer, and why

    @property
    def survived(self) -> bool | None:
        """The second request got an answer (None: the first got none, nothing to say)."""
        return None if not self.statuses else len(self.statuses) == 2

    @property
    def refused(self) -> int | None:
        """The first status that was not a rollout's answer (a proxy's 524, a 503...)."""
        return next((s for s in self.statuses if not 200 <= s < 300), None)

    def to_dict(self) -> dict[str, Any]:
        return {"idle_s": self.idle_s, "statuses": self.statuses, "survived": self.survived,
                "reconnected": self.reconnected, "error": self.error}


def _local_port(resp: httpx.Response) -> int | None:
    """The answer's local port (None once the server closed the connection with it)."""
    stream = resp.extensions.get("network_stream")
    try:
        address = stream.get_extra_info("client_addr") if stream is not None else None
    except OSError:  # the socket is gone: an answer sent with "Connection: close"
        return None
    return address[1] if isinstance(address, tuple) and len(address) > 1 else None


async def idle_probe(base_url: str, api_key: str, bodies: tuple[dict[str, Any], dict[str, Any]],
                     idle_s: float, *, timeout_s: float, secrets: tuple[str, ...] = (),
                     release: asyncio.Event | None = None,
                     first_done: asyncio.Event | None = None) -> IdleResult:
    """Send ``bodies[0]`` (then set ``first_done``), hold the connection idle ``idle_s``,
    send ``bodies[1]``: the second goes only once ``release`` is set, so that neither lands
    inside someone else's measurement. Until then the connection is not left idle longer
    than ``idle_s``: each time that much has passed, a ``GET /health`` goes out on it (itself
    a request after ``idle_s`` idle), so the idle time measured is the one asked for however
    long the others take. The result's ``idle_s`` is the idle time actually held."""
    result = IdleResult(idle_s)
    hidden = [api_key, *secrets]
    # One connection that the pool never retires itself: only the path may drop it.
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1,
                          keepalive_expiry=None)
    async with httpx.AsyncClient(base_url=base_url.rstrip("/"), headers={"X-API-Key": api_key},
                                 timeout=httpx.Timeout(timeout_s, connect=10.0), limits=limits,
                                 follow_redirects=True, verify=client_ssl_context()) as client:
        ports, answered = [], time.monotonic()
        for number, body in enumerate(bodies):
            if number:
                while True:
                    await asyncio.sleep(max(0.0, answered + idle_s - time.monotonic()))
                    if release is None or release.is_set():
                        break
                    # Held idle_s and not released yet: use the connection, then idle again.
                    if not await _touch(client, result, time.monotonic() - answered, hidden):
                        return result
                    answered = time.monotonic()
                result.idle_s = round(time.monotonic() - answered, 1)
            try:
                try:
                    resp = await client.post("/rollout", json=body)
                finally:
                    if first_done is not None:
                        first_done.set()
            except httpx.HTTPError as exc:
                which = "first" if number == 0 else f"after {result.idle_s:g}s idle, the second"
                result.error = redact(f"{which} rollout failed: {transport_error(exc)}",
                                      hidden)
                return result
            answered = time.monotonic()
            result.statuses.append(resp.status_code)
            ports.append(_local_port(resp))
            if result.refused is not None:  # not a rollout's answer: nothing left to compare
                closed = resp.headers.get("connection", "").lower() == "close"
                result.error = redact(
                    f"{'first' if number == 0 else 'second'} rollout answered HTTP "
                    f"{resp.status_code}{' and the connection closed' if closed else ''}: "
                    f"{resp.text[:200].strip() or 'no body'}", hidden)
                return result
    if None not in ports:
        result.reconnected = ports[0] != ports[1]
    return result


async def _touch(client: httpx.AsyncClient, result: IdleResult, idle: float,
                 hidden: list[str]) -> bool:
    """A ``GET /health`` on the idle connection; False (and ``result.error``) when it gets
    no answer."""
    try:
        await client.get("/health")
    except httpx.HTTPError as exc:
        result.idle_s = round(idle, 1)
        result.error = redact(f"after {result.idle_s:g}s idle, a request on the kept "
                              f"connection failed: {transport_error(exc)}", hidden)
        return False
    return True


__all__ = ["LOCAL_IDLE_S", "REMOTE_IDLE_S", "IdleResult", "idle_probe"]
