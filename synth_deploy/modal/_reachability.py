"""Can Modal's API be reached from here? Answered within a deadline, before `modal` runs.

With a token but no network, Modal's CLI retries its connection for minutes without a word.
A TCP connection to the API server (``MODAL_SERVER_URL``, else the profile's ``server_url``,
else https://api.modal.com), name lookup included, must open within ``timeout_s``; otherwise
`deploy` and `modal-serve` stop at once and say which host did not answer.
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


def require_modal_reachable(env: Env, timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> None:
    """Raise `DeployError` naming the host when Modal's API cannot be connected to in time."""
    url = modal_server_url(env)
    parts = urlsplit(url)
    try:
        host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        host = None
    if not host:
        raise DeployError(f"MODAL_SERVER_URL is not a URL: {redact_userinfo(url)!r}",
                          hint="unset it to use Modal's API, or give https://HOST[:PORT]")
    where = f"Modal's API at {host}:{port}"
    outcome: list[BaseException | None] = []

    def connect() -> None:
        try:
            # Name lookup has no timeout of its own: the thread is what the deadline bounds.
            socket.create_connection((host, port), timeout=timeout_s).close()
            outcome.append(None)
        except OSError as exc:
            outcome.append(exc)

    probe = threading.Thread(target=connect, name="modal-reachability", daemon=True)
    probe.start()
    probe.join(timeout_s)
    if not outcome or isinstance(outcome[0], TimeoutError):
        raise DeployError(f"{where} did not answer within {timeout_s:g}s, so nothing was "
                          f"sent to Modal", hint=_FIX)
    if (error := outcome[0]) is not None:
        reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
        raise DeployError(f"{where} is unreachable ({reason}), so nothing was sent to Modal",
                          hint=_FIX)


__all__ = ["DEFAULT_CONNECT_TIMEOUT_S", "modal_server_url", "require_modal_reachable"]
