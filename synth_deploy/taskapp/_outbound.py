"""Outbound HTTP made on a request's behalf (`ctx.http`, the policy call, the vendor proxy):
one aiohttp session per served app, made at start-up; redirects are not followed, and
link-local addresses are refused unless the app allows them.

Every turn of an episode is a policy call, so this path is the server's hot loop: aiohttp's
pool and parser cost a fraction of httpx's per request (infra/outbound.md has the figures).
The kit's own calls (`post_capped`) use the session directly; ``ctx.http`` keeps httpx's API,
the SDK's since the start, on a transport that sends through the same session and guard.

A key holder chooses ``policy.config.inference_url``, so a key holder chooses where the server
connects. Link-local addresses are where cloud metadata services answer (169.254.169.254 on
AWS, GCP and Azure; fd00:ec2::254 on AWS over IPv6) with credentials for the machine the app
runs on. The check is made on the address actually connected to, after DNS: a name that
resolves there, or answers differently on a second lookup, is refused too.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import ssl
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import anyio
import httpx
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from pydantic_core import from_json

from synth_deploy.tls import client_ssl_context

# AWS's IPv6 metadata address is a unique-local one, not link-local by the RFCs.
_METADATA_V6 = ipaddress.IPv6Address("fd00:ec2::254")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")

ALLOW_LINK_LOCAL_HINT = ("link-local addresses are refused because cloud metadata services "
                         "answer there; an app that really needs one sets "
                         "allow_link_local=True in its TaskApp(...)")

# Both would be the Authorization header: one would be dropped without a word.
CREDENTIALS_CONFLICT = ("carries a user:password@ and an Authorization header is set too "
                        "(an api_key's Bearer token): both go in the one Authorization "
                        "header, so one of them would be dropped")
CREDENTIALS_HINT = "keep one: the URL without user:password@, or no key/Authorization header"

# A policy call may think for minutes; connecting is quick or broken. Idle connections expire
# before uvicorn's 5 s keep-alive does, so the pool rarely hands out one the policy server is
# closing (and a call that meets one is sent again: `_policy`).
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 600.0
KEEPALIVE_S = 3.0


class RefusedAddress(OSError):
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


class _GuardedResolver(AbstractResolver):
    """DNS answers with a link-local address in them refused, so the error names the host."""

    def __init__(self) -> None:
        self._inner = DefaultResolver()

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        answers = await self._inner.resolve(host, port, family)
        for answer in answers:
            if is_link_local(answer["host"]):
                raise RefusedAddress(host, answer["host"])
        return answers

    async def close(self) -> None:
        await self._inner.close()


def _guarded_socket(addr_info: Any) -> socket.socket:
    """The socket for one address about to be connected to: the last word on the guard (an
    IP literal in a URL never goes through the resolver)."""
    family, kind, proto, _, address = addr_info
    if is_link_local(str(address[0])):
        raise RefusedAddress(str(address[0]), str(address[0]))
    return socket.socket(family, kind, proto)


class PolicyAnswer:
    """An answer read whole: what `post_capped` returns."""

    __slots__ = ("content", "headers", "status_code")

    def __init__(self, status_code: int, headers: Mapping[str, str], content: bytes) -> None:
        self.status_code, self.headers, self.content = status_code, headers, content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        try:
            return from_json(self.content)  # a parse of each policy answer: the fast one
        except ValueError:  # what only the stdlib reads (a lone surrogate escape, a BOM)
            return json.loads(self.content)


class AnswerTooLarge(Exception):
    """An answer longer than the caller's cap; it was not read."""


class OutboundClient(httpx.AsyncClient):
    """``ctx.http``: an `httpx.AsyncClient` sending through the app's one aiohttp session, and
    `post_capped`, the kit's own calls on that session without httpx in the way.

    Made by `open_outbound` at start-up (the session, its pool and TLS context are never set
    up on the loop while rollouts run); closed with ``aclose``.
    """

    def __init__(self, session: aiohttp.ClientSession, tls: ssl.SSLContext) -> None:
        super().__init__(transport=_SessionTransport(session, tls), follow_redirects=False,
                         timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S))
        self.session, self._tls = session, tls

    def build_request(self, *args: Any, **kwargs: Any) -> httpx.Request:
        """httpx's, refusing a URL's userinfo beside an Authorization header (httpx would let
        the userinfo win without a word)."""
        request = super().build_request(*args, **kwargs)
        if request.url.userinfo and "authorization" in request.headers:
            raise httpx.InvalidURL(f"the URL {CREDENTIALS_CONFLICT}; {CREDENTIALS_HINT}")
        return request

    async def post_capped(self, url: str, body: bytes, headers: Mapping[str, str], *,
                          max_bytes: int, timeout: aiohttp.ClientTimeout | None = None
                          ) -> PolicyAnswer:
        """POST ``body`` (JSON) and read the answer whole, unless it is longer than
        ``max_bytes`` (`AnswerTooLarge`: whoever holds a key picks the URL, and must not make
        the server hold gigabytes). aiohttp's errors pass through; redirects are answers."""
        async with self.session.post(url, data=body, headers=headers, allow_redirects=False,
                                     ssl=self._tls, timeout=timeout or _TIMEOUT) as answer:
            if (answer.content_length or 0) > max_bytes:
                raise AnswerTooLarge
            chunks, size = [], 0
            while chunk := await answer.content.read(2**16):
                size += len(chunk)
                if size > max_bytes:
                    raise AnswerTooLarge
                chunks.append(chunk)
            return PolicyAnswer(answer.status, answer.headers, b"".join(chunks))

    async def aclose(self) -> None:
        await super().aclose()
        await self.session.close()


_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S,
                                 sock_read=READ_TIMEOUT_S)


class _SessionTransport(httpx.AsyncBaseTransport):
    """httpx's requests sent through an aiohttp session; its errors turned into httpx's."""

    def __init__(self, session: aiohttp.ClientSession, tls: ssl.SSLContext) -> None:
        self._session, self._tls = session, tls

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        limits = request.extensions.get("timeout", {})
        timeout = aiohttp.ClientTimeout(total=None, connect=limits.get("pool"),
                                        sock_connect=limits.get("connect"),
                                        sock_read=limits.get("read"))
        # httpx has made the userinfo an Authorization header already; aiohttp would refuse
        # the two together.
        url = request.url.copy_with(userinfo=b"") if request.url.userinfo else request.url
        with _as_httpx_error(request):
            answer = await self._session.request(
                request.method, str(url), headers=request.headers.multi_items(),
                data=await request.aread(), allow_redirects=False, timeout=timeout,
                ssl=self._tls, auto_decompress=False,  # httpx decodes what it reads
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"))
        return httpx.Response(answer.status, headers=answer.raw_headers,
                              stream=_AnswerStream(answer, request),
                              extensions={"http_version": b"HTTP/1.1"})


class _AnswerStream(httpx.AsyncByteStream):
    def __init__(self, answer: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self._answer, self._request = answer, request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _as_httpx_error(self._request):
            async for chunk in self._answer.content.iter_any():
                yield chunk

    async def aclose(self) -> None:
        self._answer.release()


class _as_httpx_error:  # noqa: N801 - used as a `with` statement
    """aiohttp's and the socket's errors as the httpx ones an app catches, chained."""

    def __init__(self, request: httpx.Request) -> None:
        self._request = request

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> bool:
        if exc is None or isinstance(exc, httpx.HTTPError):
            return False
        error = _httpx_error(exc)
        if error is None:
            return False
        raise error(str(exc) or type(exc).__name__, request=self._request) from exc


def _httpx_error(exc: BaseException) -> type[httpx.TransportError] | None:
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout
    if isinstance(exc, aiohttp.SocketTimeoutError | TimeoutError):
        return httpx.ReadTimeout
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return httpx.RemoteProtocolError
    if isinstance(exc, aiohttp.ClientError | OSError):
        return httpx.ReadError
    return None


async def open_outbound(*, allow_link_local: bool, max_connections: int) -> OutboundClient:
    """The client a served app calls out with: bounded, no redirects, link-local refused.

    Call it at start-up, on the loop that will use it. ``max_connections``: at most this many
    open at once (one a rollout in flight is the server's bound); more requests wait.
    """
    # The certificates are read off the loop; aiohttp makes its own contexts when imported.
    tls = await anyio.to_thread.run_sync(client_ssl_context)
    guard: dict[str, Any] = {} if allow_link_local else {
        "resolver": _GuardedResolver(), "socket_factory": _guarded_socket}
    connector = aiohttp.TCPConnector(limit=max_connections, keepalive_timeout=KEEPALIVE_S,
                                     ssl=tls, **guard)
    session = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar(),
                                    timeout=_TIMEOUT, raise_for_status=False,
                                    trust_env=False)
    return OutboundClient(session, tls)


def refused_address(exc: BaseException) -> RefusedAddress | None:
    """The guard's refusal behind an aiohttp or httpx error, if that is what it was."""
    while exc is not None:
        if isinstance(exc, RefusedAddress):
            return exc
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return None


__all__ = ["ALLOW_LINK_LOCAL_HINT", "AnswerTooLarge", "CREDENTIALS_CONFLICT", "CREDENTIALS_HINT",
           "OutboundClient", "PolicyAnswer", "RefusedAddress", "is_link_local", "open_outbound",
           "refused_address"]
