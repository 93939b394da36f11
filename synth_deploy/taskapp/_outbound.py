"""Outbound HTTP made on a request's behalf (`ctx.http`, the policy call): redirects are not
followed, and link-local addresses are refused unless the app allows them.

A key holder chooses ``policy.config.inference_url``, so a key holder chooses where the server
connects. Link-local addresses are where cloud metadata services answer (169.254.169.254 on
AWS, GCP and Azure; fd00:ec2::254 on AWS over IPv6) with credentials for the machine the app
runs on. The check is made on the address actually connected to, after DNS: a name that
resolves there, or answers differently on a second lookup, is refused too.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import anyio
import httpcore
import httpx

from synth_deploy.tls import client_ssl_context

# AWS's IPv6 metadata address is a unique-local one, not link-local by the RFCs.
_METADATA_V6 = ipaddress.IPv6Address("fd00:ec2::254")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")

ALLOW_LINK_LOCAL_HINT = ("link-local addresses are refused because cloud metadata services "
                         "answer there; an app that really needs one sets "
                         "allow_link_local=True in its TaskApp(...)")


class RefusedAddress(httpcore.ConnectError):
    """A connection the guard refused: ``host`` resolved to the link-local ``address``."""

    def __init__(self, host: str, address: str) -> None:
        super().__init__(f"{host} resolves to the link-local address {address}: refused")
        self.host, self.address = host, address


def is_link_local(address: str) -> bool:
    """True for 169.254.0.0/16, fe80::/10, fd00:ec2::254, and their IPv4-in-IPv6 forms."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        if ip == _METADATA_V6:
            return True
        embedded = ip.ipv4_mapped or ip.sixtofour or (
            ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF) if ip in _NAT64 else None)
        if embedded is not None:
            ip = embedded
    return ip.is_link_local


class _GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend, resolving names itself and refusing link-local answers."""

    def __init__(self, inner: httpcore.AsyncNetworkBackend) -> None:
        self._inner = inner

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None
                          ) -> httpcore.AsyncNetworkStream:
        try:
            with anyio.fail_after(timeout):
                infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(f"resolving {host} timed out") from exc
        except OSError as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from exc
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        for address in addresses:
            if is_link_local(address):
                raise RefusedAddress(host, address)
        error: Exception | None = None
        for address in addresses:  # connect to what was checked, not to a second lookup
            try:
                return await self._inner.connect_tcp(address, port, timeout=timeout,
                                                     local_address=local_address,
                                                     socket_options=socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                error = exc
        raise error or httpcore.ConnectError(f"{host} resolves to no address")

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None
                                  ) -> httpcore.AsyncNetworkStream:
        return await self._inner.connect_unix_socket(path, timeout=timeout,
                                                     socket_options=socket_options)

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _GuardedTransport(httpx.AsyncHTTPTransport):
    def __init__(self, limits: httpx.Limits, tls: ssl.SSLContext) -> None:
        super().__init__(limits=limits, verify=tls)
        # httpx does not take a network backend; its pool is rebuilt with the same settings
        # and ours (tests/serving/test_hardening.py fails if httpx stops using `_pool`).
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=tls, max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_GuardedBackend(httpcore.AnyIOBackend()))


class _SpreadTransport(httpx.AsyncBaseTransport):
    """Requests spread over several small connection pools, each sent through the pool with
    the fewest requests in flight.

    httpcore 1.0's pool does work quadratic in its connections on every request it starts or
    finishes (encode/httpcore#1035, encode/httpx#3215): with 32 rollouts calling the policy at
    once, that bookkeeping was ~70% of the calling process's CPU. Pools of a few connections
    each keep it small; together they hold as many connections as one pool would.
    """

    def __init__(self, pools: list[httpx.AsyncBaseTransport]) -> None:
        self.pools = pools
        self._in_flight = [0] * len(pools)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        index = min(range(len(self.pools)), key=self._in_flight.__getitem__)
        self._in_flight[index] += 1
        try:
            response = await self.pools[index].handle_async_request(request)
        except BaseException:
            self._in_flight[index] -= 1
            raise
        response.stream = _Released(response.stream, self._in_flight, index)
        return response

    async def aclose(self) -> None:
        for pool in self.pools:
            await pool.aclose()


class _ByScheme(httpx.AsyncBaseTransport):
    """Plain HTTP to pools that hold no certificates; HTTPS to pools made at the first HTTPS
    request.

    Loading the CA bundle is a noticeable part of a served app's start, and a policy on
    127.0.0.1 or a private network never needs it. The plain pools get a context that trusts
    no certificate, so a TLS connection could never go unverified through them.
    """

    def __init__(self, pools: Callable[[ssl.SSLContext], _SpreadTransport]) -> None:
        self._pools = pools
        self.plain = pools(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))  # verifies, trusts none
        self.tls: _SpreadTransport | None = None
        self._making_tls = asyncio.Lock()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme != "https":
            return await self.plain.handle_async_request(request)
        if self.tls is None:
            async with self._making_tls:
                if self.tls is None:  # off the loop: it reads and parses a file
                    self.tls = self._pools(await anyio.to_thread.run_sync(client_ssl_context))
        return await self.tls.handle_async_request(request)

    async def aclose(self) -> None:
        await self.plain.aclose()
        if self.tls is not None:
            await self.tls.aclose()


class _Released(httpx.AsyncByteStream):
    """A response body that gives its pool's in-flight slot back once it is closed."""

    def __init__(self, inner: Any, in_flight: list[int], index: int) -> None:
        self._inner, self._in_flight = inner, in_flight
        self._index: int | None = index  # None once given back

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            yield chunk

    async def aclose(self) -> None:
        if self._index is not None:
            self._in_flight[self._index] -= 1
            self._index = None
        await self._inner.aclose()


def outbound_client(*, allow_link_local: bool) -> httpx.AsyncClient:
    """The client a served app calls out with: bounded, no redirects, link-local refused."""
    # 8 pools of at most 32 connections (see `_SpreadTransport`), each keeping all of its
    # connections alive: httpcore 1.0 closes idle ones whenever a pool holds more than
    # max_keepalive_connections in all. Idle connections expire before uvicorn's 5 s
    # keep-alive does, so a pool rarely hands out one the policy server is closing.
    limits = httpx.Limits(max_connections=32, max_keepalive_connections=32,
                          keepalive_expiry=3.0)

    def pools(tls: ssl.SSLContext) -> _SpreadTransport:
        return _SpreadTransport([httpx.AsyncHTTPTransport(limits=limits, verify=tls)
                                 if allow_link_local else _GuardedTransport(limits, tls)
                                 for _ in range(8)])

    return httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0),
                             transport=_ByScheme(pools), follow_redirects=False)


def refused_address(exc: BaseException) -> RefusedAddress | None:
    """The guard's refusal behind an httpx error, if that is what it was."""
    while exc is not None:
        if isinstance(exc, RefusedAddress):
            return exc
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return None


__all__ = ["ALLOW_LINK_LOCAL_HINT", "RefusedAddress", "is_link_local", "outbound_client",
           "refused_address"]
