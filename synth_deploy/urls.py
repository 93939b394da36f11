"""The one rule for a URL the user gives, the same in every command that takes one.

`check URL`, `smoke`/`eval URL`, `--inference-url`, `train --task-url` (and TASK_APP_URL,
`--backend`) and `tunnel --url` all read a URL through `http_url`: an http(s) scheme, a host
and a valid port are required, and anything else is a `URLError` that says what is wrong and
how to write it. Nothing is guessed: "127.0.0.1:8001" could mean http or https, so it is
refused with both spellings in the hint.

    http_url("http://127.0.0.1:8001/")   # -> "http://127.0.0.1:8001"
    http_url("127.0.0.1:8001")           # URLError: '127.0.0.1:8001' has no scheme
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit, urlunsplit

from synth_deploy.errors import UsageError

SHAPE = "http(s)://HOST[:PORT]"

# "host:port" or "host:port/path" without a scheme: an IPv4 address, a bracketed IPv6
# address, or a host name (letters, digits, dots, dashes).
_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):\d{1,5}(/.*)?$")
# A dotted host name or an IPv4 address with nothing else ("my-app.modal.run", "10.0.0.5").
_DOTTED_HOST = re.compile(r"^(\d{1,3}(\.\d{1,3}){3}|([A-Za-z0-9-]+\.)+[A-Za-z]{2,})(/.*)?$")


class URLError(UsageError):
    """A URL that cannot name a task app; ``code`` says which part is wrong (no_scheme,
    bad_scheme, no_host, bad_port, invalid_url)."""

    def __init__(self, message: str, *, hint: str, code: str) -> None:
        super().__init__(message, hint=hint)
        self.code = code


def http_url(text: str | None, *, what: str = "") -> str:
    """``text`` as an http(s) base URL (trimmed, no trailing slash), or a `URLError`.

    ``what`` names where the URL came from ("--task-url", "TASK_APP_URL") and starts the
    message, so the user knows which value to fix.
    """
    prefix = f"{what}: " if what else ""
    raw = (text or "").strip()
    if not raw:
        raise URLError(f"{prefix}the URL is empty", code="invalid_url",
                       hint="pass the task app's URL, e.g. http://127.0.0.1:8001")
    try:
        parts = urlsplit(raw)
        host = parts.hostname
    except ValueError as exc:  # e.g. "http://[::1" (an unclosed IPv6 bracket)
        raise URLError(f"{prefix}{raw!r} is not a URL: {exc}", code="invalid_url",
                       hint=f"write it as {SHAPE}") from None
    if "://" not in raw:
        raise URLError(f"{prefix}{raw!r} has no scheme", code="no_scheme",
                       hint=f"add the scheme: https://{raw} (or http://{raw} for a local "
                            "server)")
    if parts.scheme not in ("http", "https"):
        raise URLError(f"{prefix}{raw!r} is not an http(s) URL (its scheme is "
                       f"{parts.scheme!r})", code="bad_scheme",
                       hint=f"use http:// or https://: write it as {SHAPE}")
    if not host:
        raise URLError(f"{prefix}{raw!r} has no host", code="no_host",
                       hint=f"write it as {SHAPE}")
    try:
        parts.port  # noqa: B018 - parsing the port is the check
    except ValueError:
        raise URLError(f"{prefix}{raw!r} has an invalid port", code="bad_port",
                       hint="a port is a number from 1 to 65535") from None
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), parts.query,
                       parts.fragment))


def looks_like_url(text: str) -> bool:
    """True for text meant as a URL, scheme or not ("http://...", "localhost:8001",
    "my-app.modal.run"), so that a command taking an app id *or* a URL can tell a URL missing
    its scheme from an app id. File paths ("tiny.py", "apps/x/task_app.py") are not URLs."""
    text = text.strip()
    if "://" in text:
        return True
    if text.endswith(".py") or "/" in text.split(":", 1)[0]:
        return False
    return bool(_HOST_PORT.match(text) or _DOTTED_HOST.match(text)
                or text == "localhost" or text.startswith("localhost/"))


def is_loopback(url: str) -> bool:
    """True when ``url``'s host is this machine (see `is_loopback_host`)."""
    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        return False
    return is_loopback_host(host)


def is_loopback_host(host: str) -> bool:
    """The one rule for "this machine": ``localhost`` (and names under it), 127.0.0.0/8 and
    ::1, bracketed or not. A name that merely resolves to 127.0.0.1 is not: what it
    resolves to can change.

        is_loopback_host("127.0.0.2")  # True
        is_loopback_host("[::1]")      # True
        is_loopback_host("localhost.evil.example")  # False
    """
    host = host.strip().lower().removeprefix("[").removesuffix("]").rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


__all__ = ["SHAPE", "URLError", "http_url", "is_loopback", "is_loopback_host", "looks_like_url"]
