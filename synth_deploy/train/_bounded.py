"""`bounded_send`: one request to the training backend, whole, within a deadline and a size.

httpx bounds each step of a request (connect, each read, each write), never the whole: a
backend (or a proxy before it) that drips a byte every few seconds, in its headers or its
body, holds the client for ever, and a 200 whose body never ends is read into memory until
the machine gives out. Here the time left before the request's deadline caps every socket
operation of it, connect and TLS included, and the body is read in chunks up to a cap.

The cap on socket operations comes from the network backend of the client's own connection
pools (``install_deadlines``), which httpx does not let one pass: a client built with a
``transport`` of the caller's (a test's ``MockTransport``) keeps the deadline between body
chunks only.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

MAX_ANSWER_BYTES = 16 * 2**20  # a job, a page of events or metrics: kilobytes

# The deadline (time.monotonic()) of the request this thread is sending, if any.
_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "synth_deploy_backend_deadline", default=None)


class AnswerTooLarge(Exception):
    """The answer's body passed `MAX_ANSWER_BYTES`; it was not read further."""


def bounded_send(client: httpx.Client, request: httpx.Request, *, within_s: float,
                 max_bytes: int = MAX_ANSWER_BYTES) -> httpx.Response:
    """``request`` sent and its answer read whole within ``within_s`` seconds, or
    `httpx.TimeoutException` (`httpx.ReadTimeout` once the answer has begun); a body past
    ``max_bytes`` is `AnswerTooLarge`."""
    deadline = time.monotonic() + within_s
    token = _deadline.set(deadline)
    try:
        response = client.send(request, stream=True)
        try:
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > max_bytes:
                raise AnswerTooLarge
            chunks, size = [], 0
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > max_bytes:
                    raise AnswerTooLarge
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise httpx.ReadTimeout(f"the answer took more than {within_s:g}s",
                                            request=request)
        finally:
            response.close()
    finally:
        _deadline.reset(token)
    # The body as read (decoded): the headers that described its encoding no longer apply.
    headers = [(k, v) for k, v in response.headers.multi_items()
               if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
    return httpx.Response(response.status_code, headers=headers, content=b"".join(chunks),
                          request=request)


def install_deadlines(client: httpx.Client) -> None:
    """Make every connection pool of ``client`` (its own, and those for the proxies the
    environment names) cap each socket operation by the deadline `bounded_send` set.

    httpx takes no network backend, so the pools' is wrapped in place; a transport without a
    pool (a test's) is left as it is (tests/train/test_train_client.py fails if httpx stops
    keeping its pool in ``_pool``)."""
    transports = [client._transport, *client._mounts.values()]
    for transport in transports:
        pool = getattr(transport, "_pool", None)
        if isinstance(pool, httpcore.ConnectionPool):
            pool._network_backend = _DeadlineBackend(pool._network_backend)


def _within(timeout: float | None, what: type[Exception]) -> float | None:
    deadline = _deadline.get()
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise what("the request's deadline passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _within(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _within(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._inner.start_tls(
            ssl_context, server_hostname, _within(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._inner.connect_tcp(
            host, port, _within(timeout, httpcore.ConnectTimeout), local_address,
            socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None
                            ) -> httpcore.NetworkStream:
        return _DeadlineStream(self._inner.connect_unix_socket(
            path, _within(timeout, httpcore.ConnectTimeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


__all__ = ["MAX_ANSWER_BYTES", "AnswerTooLarge", "bounded_send", "install_deadlines"]
