"""The steps below HTTP: the URL itself, DNS, TCP connect and the TLS handshake.

Each is timed and bounded by a timeout, and each turns the operating system's error into a
`CheckResult` that names the cause and the fix. They run before any HTTP request so that
"nothing answers at this address" is told apart from "the app answers wrong".
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit, urlunsplit

from synth_deploy.health._report import CheckResult
from synth_deploy.urls import URLError, http_url, is_loopback_host

# A base URL that ends in one of these was copied from an endpoint, not from the app's root.
ENDPOINT_PATHS = ("health", "info", "task_info", "rollout", "done", "docs", "openapi.json",
                  "proxy/v1/chat/completions", "v1/chat/completions", "debug/env")


@dataclass(frozen=True)
class Target:
    """A checked, normalised base URL split into what the probes need."""

    base_url: str
    scheme: str
    host: str
    port: int

    @property
    def is_loopback(self) -> bool:
        return is_loopback_host(self.host)

    @property
    def is_ip(self) -> bool:
        try:
            ipaddress.ip_address(self.host)
            return True
        except ValueError:
            return False


def check_url(url: str) -> tuple[CheckResult, Target | None]:
    """Scheme, host, port, and no endpoint path pasted by mistake (a trailing ``/health``)."""
    expected = "http(s)://HOST[:PORT][/PREFIX], the app's base URL"
    text = (url or "").strip()

    def bad(actual: str, hint: str, code: str = "invalid_url") -> tuple[CheckResult, None]:
        return CheckResult("url", "fail", expected, actual, hint=hint, code=code), None

    try:
        base = http_url(text)  # the kit's one URL rule, as every command applies it
    except URLError as exc:
        return bad(exc.message, exc.hint or "", code=exc.code)
    parts = urlsplit(base)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    path = parts.path.rstrip("/")
    misfit = _misfit(parts, path)
    if misfit is not None:
        return bad(*misfit)
    target = Target(urlunsplit((parts.scheme, parts.netloc, path, "", "")), parts.scheme,
                    host, port)
    if target.scheme == "http" and not target.is_loopback:
        return CheckResult(
            "url", "warn", expected, target.base_url, code="insecure_http",
            hint="plain http to a remote host sends the API key in clear text: use https"), target
    return CheckResult("url", "pass", expected, target.base_url), target


def _misfit(parts: SplitResult, path: str) -> tuple[str, str, str] | None:
    """What is wrong with a URL that is not the app's bare base URL (actual, hint, code):
    credentials, an endpoint's path, a query or fragment; None when it is one."""
    if parts.username or parts.password:
        return ("credentials in the URL", "remove user:password@ from the URL; pass the key "
                "with --api-key or ENVIRONMENT_API_KEY instead", "credentials_in_url")
    for endpoint in ENDPOINT_PATHS:
        if path == "/" + endpoint or path.endswith("/" + endpoint):
            base = urlunsplit((parts.scheme, parts.netloc, path[: -len(endpoint) - 1], "", ""))
            return (f"ends with the endpoint /{endpoint}",
                    f"pass the base URL without the endpoint: {base}", "endpoint_in_url")
    if parts.query or parts.fragment:
        base = urlunsplit((parts.scheme, parts.netloc, path, "", ""))
        return "has a query or fragment", f"pass the base URL only: {base}", "query_in_url"
    return None


def resolve(target: Target, timeout_s: float) -> tuple[CheckResult, list[tuple]]:
    """DNS: the host's addresses, within ``timeout_s`` (getaddrinfo has no timeout of its own)."""
    expected = f"{target.host} resolves to an address"
    if target.is_ip:
        addrs = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
        return CheckResult("dns", "pass", expected, f"{target.host} (an IP address)",
                           latency_ms=0.0), addrs
    holder: dict[str, object] = {}

    def lookup() -> None:
        try:
            holder["addrs"] = socket.getaddrinfo(target.host, target.port,
                                                 type=socket.SOCK_STREAM)
        except OSError as exc:
            holder["error"] = exc

    started = time.perf_counter()
    thread = threading.Thread(target=lookup, name="synth-deploy-dns", daemon=True)
    thread.start()
    thread.join(timeout_s)
    latency = (time.perf_counter() - started) * 1000
    if thread.is_alive():
        return CheckResult(
            "dns", "fail", expected, f"no answer within {timeout_s:g}s", latency,
            code="dns_timeout",
            hint="the DNS server did not answer: check the network or your resolver"), []
    if "error" in holder:
        hint = (f"{target.host} does not resolve: check the name for a typo"
                + ("; a new quick tunnel's name can take a few seconds to propagate, so "
                   "retry with --wait 30" if target.host.endswith(".trycloudflare.com") else
                   "; a tunnel or Modal URL that was just created may still be propagating: "
                   "retry with --wait 30"))
        return CheckResult("dns", "fail", expected, f"does not resolve ({holder['error']})",
                           latency, hint=hint, code="dns_unresolved"), []
    addrs = holder["addrs"]  # type: ignore[assignment]
    shown = ", ".join(dict.fromkeys(a[4][0] for a in addrs))  # type: ignore[union-attr]
    return CheckResult("dns", "pass", expected, shown, latency), addrs  # type: ignore[return-value]


def connect(target: Target, addrs: list[tuple], timeout_s: float
            ) -> tuple[CheckResult, socket.socket | None]:
    """TCP: open a connection to the first address that accepts one."""
    expected = f"a TCP connection to port {target.port}"
    started = time.perf_counter()
    last: OSError | None = None
    for family, type_, proto, _, sockaddr in addrs:
        sock = socket.socket(family, type_, proto)
        sock.settimeout(timeout_s)
        try:
            sock.connect(sockaddr)
        except OSError as exc:
            sock.close()
            last = exc
            continue
        latency = (time.perf_counter() - started) * 1000
        return CheckResult("tcp", "pass", expected, f"connected to {sockaddr[0]}:{sockaddr[1]}",
                           latency), sock
    latency = (time.perf_counter() - started) * 1000
    where = f"{target.host}:{target.port}"
    if isinstance(last, ConnectionRefusedError):
        return CheckResult(
            "tcp", "fail", expected, f"connection refused at {where}", latency,
            code="connection_refused",
            hint=f"nothing listens on {where}: start the app (`synth-deploy serve APP --port "
                 f"{target.port}`) or fix the port in the URL"), None
    if isinstance(last, TimeoutError):
        return CheckResult(
            "tcp", "fail", expected, f"no answer within {timeout_s:g}s at {where}", latency,
            code="connect_timeout",
            hint="the host did not answer: it is down, a firewall drops the packets, or the "
                 "address is wrong"), None
    return CheckResult("tcp", "fail", expected, f"cannot connect to {where}: {last}", latency,
                       code="connect_error",
                       hint="check the host and port, and that this machine has a route to it"
                       ), None


def handshake(target: Target, sock: socket.socket, context: ssl.SSLContext,
              timeout_s: float) -> CheckResult:
    """TLS: the handshake, with the same verification the HTTP client uses."""
    expected = f"a TLS certificate valid for {target.host}"
    sock.settimeout(timeout_s)
    started = time.perf_counter()
    try:
        with context.wrap_socket(sock, server_hostname=target.host) as tls:
            version = tls.version()
    except ssl.SSLCertVerificationError as exc:
        reason = exc.verify_message or str(exc)
        return CheckResult("tls", "fail", expected, f"certificate rejected: {reason}",
                           (time.perf_counter() - started) * 1000, code="tls_error",
                           hint=_cert_hint(reason, target.host))
    except ssl.SSLError as exc:
        reason = exc.reason or str(exc)
        plain = "WRONG_VERSION_NUMBER" in str(exc).upper() or "record layer" in str(exc)
        hint = ("the server speaks plain HTTP on this port: use http:// instead of https://"
                if plain else "the TLS handshake failed: check that the URL points at an "
                              "HTTPS endpoint and that no proxy intercepts TLS")
        return CheckResult("tls", "fail", expected, f"handshake failed: {reason}",
                           (time.perf_counter() - started) * 1000, code="tls_error", hint=hint)
    except TimeoutError:
        return CheckResult("tls", "fail", expected, f"no handshake within {timeout_s:g}s",
                           (time.perf_counter() - started) * 1000, code="tls_error",
                           hint="the server accepted the connection but never answered the TLS "
                                "handshake: is it an HTTPS port?")
    except OSError as exc:
        return CheckResult("tls", "fail", expected, f"connection lost during handshake: {exc}",
                           (time.perf_counter() - started) * 1000, code="tls_error",
                           hint="the server closed the connection: is it an HTTPS port?")
    finally:
        sock.close()
    return CheckResult("tls", "pass", expected, f"{version}, certificate verified",
                       (time.perf_counter() - started) * 1000)


def _cert_hint(reason: str, host: str) -> str:
    lowered = reason.lower()
    if "self" in lowered and "signed" in lowered:
        return ("the server's certificate is self-signed, so no client trusts it: serve a "
                "certificate from a public CA (Modal and Cloudflare tunnels do this for you), or "
                "check the local server over http://")
    if "expired" in lowered:
        return "the server's certificate has expired: renew it"
    if "hostname" in lowered or "ip address mismatch" in lowered:
        return f"the certificate is for another name than {host}: check the URL's host"
    return "the certificate is not trusted: it must chain to a public CA"


__all__ = ["ENDPOINT_PATHS", "Target", "check_url", "connect", "handshake", "resolve"]
