"""Can Modal's API be reached from here? Answered within a deadline, before `modal` runs.

With a token but no network, Modal's CLI retries its connection for minutes without a word.
A TCP connection to the API server (``MODAL_SERVER_URL``, else the profile's ``server_url``,
else Modal's default; each may list fallbacks, comma-separated, of which one must answer),
name lookup included, must open within ``timeout_s``; otherwise `deploy` and `modal-serve`
stop at once and say which hosts did not answer.
"""

from __future__ import annotations

import socket
import threading
from urllib.parse import urlsplit

from synth_deploy.env import Env, redact_userinfo
from synth_deploy.errors import DeployError

DEFAULT_SERVER_URL = "https://api.modal.com"
DEFAULT_CONNECT_TIMEOUT_S = 15.0
_FIX = ("check this machine's network (and https://status.modal.com); MODAL_SERVER_URL, "
        "when set, must name Modal's API")


def modal_server_url(env: Env) -> str:
    """The API server `modal` will use: the env's MODAL_SERVER_URL, the profile's, Modal's."""
    if url := env.get("MODAL_SERVER_URL"):
        return url
    try:
        from modal.config import config

        return str(config.get("server_url") or DEFAULT_SERVER_URL)
    except Exception:  # modal missing or its config unreadable: the token check says which
        return DEFAULT_SERVER_URL


def modal_api_endpoints(url: str) -> list[tuple[str, int]]:
    """(host, port) of each API server in ``url``: Modal's client takes a comma-separated
    list (its default names a fallback) and uses the first that connects."""
    endpoints = []
    for each in (u.strip() for u in url.split(",")):
        parts = urlsplit(each)
        try:
            host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            host = None
        if not host:
            raise DeployError(f"MODAL_SERVER_URL is not a URL: {redact_userinfo(each)!r}",
                              hint="unset it to use Modal's API, or give https://HOST[:PORT]")
        endpoints.append((host, port))
    return list(dict.fromkeys(endpoints))


def require_modal_reachable(env: Env, timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> None:
    """Raise `DeployError` naming the hosts when none of Modal's API servers can be connected
    to in time."""
    endpoints = modal_api_endpoints(modal_server_url(env))
    where = "Modal's API at " + " or ".join(f"{host}:{port}" for host, port in endpoints)
    outcomes: dict[tuple[str, int], BaseException | None] = {}
    done = threading.Event()

    def connect(endpoint: tuple[str, int]) -> None:
        try:
            # Name lookup has no timeout of its own: the threads are what the deadline bounds.
            socket.create_connection(endpoint, timeout=timeout_s).close()
            outcomes[endpoint] = None
        except OSError as exc:
            outcomes[endpoint] = exc
        if None in outcomes.values() or len(outcomes) == len(endpoints):
            done.set()

    for endpoint in endpoints:
        threading.Thread(target=connect, args=(endpoint,), name="modal-reachability",
                         daemon=True).start()
    done.wait(timeout_s)
    answers = dict(outcomes)
    if None in answers.values():
        return

    def reason(endpoint: tuple[str, int]) -> str:
        error = answers.get(endpoint)
        if error is None or isinstance(error, TimeoutError):
            return f"no answer within {timeout_s:g}s"
        return getattr(error, "strerror", None) or str(error) or type(error).__name__

    if all(reason(e).startswith("no answer") for e in endpoints):
        raise DeployError(f"{where} did not answer within {timeout_s:g}s, so nothing was "
                          f"sent to Modal", hint=_FIX)
    reasons = reason(endpoints[0]) if len(endpoints) == 1 else "; ".join(
        f"{host}:{port}: {reason((host, port))}" for host, port in endpoints)
    raise DeployError(f"{where} is unreachable ({reasons}), so nothing was sent to Modal",
                      hint=_FIX)


__all__ = ["DEFAULT_CONNECT_TIMEOUT_S", "modal_api_endpoints", "modal_server_url",
           "require_modal_reachable"]
