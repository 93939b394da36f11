"""API key checks for task app endpoints (shared/spec/task-app-protocol.md, Authentication).

Unlike synth-ai (400 with the first 15 characters of the valid key in the body), we answer
401 when no key was sent and 403 when a wrong one was, compare in constant time, and never
put key material (no prefix, no length) in a response or a log line.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from synth_deploy.env import ENVIRONMENT_API_KEY, Env, mask, mint_key
from synth_deploy.errors import UsageError

MISSING_KEY_MESSAGE = (
    "the server has no ENVIRONMENT_API_KEY configured: run `synth-deploy setup` to mint one "
    "into .env, or set ENVIRONMENT_API_KEY in the server's environment (a Modal Secret when "
    "deployed), then restart the server"
)


@dataclass(frozen=True)
class AuthFailure:
    status: int
    code: str
    message: str


RequestHeaders = Mapping[str, str] | list[tuple[bytes, bytes]]


def presented_keys(headers: RequestHeaders) -> list[bytes]:
    """Every key a client sent: `X-API-Key`, `X-API-Keys` (comma list), `Authorization: Bearer`.

    ``headers``: a mapping, or an ASGI scope's raw list of (lower-case name, value) pairs,
    which the hot path passes. Keys stay bytes from the header to the comparison: nothing
    is decoded and encoded again on the hot path.
    """
    raw = headers if isinstance(headers, list) else getattr(headers, "raw", None)
    if raw is None:
        raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]  # type: ignore[union-attr]
    keys: list[bytes] = []
    for name, value in raw:
        reader = _KEY_HEADERS.get(name)
        if reader is not None:
            keys.extend(reader(value))
    return [k for k in keys if k]


def _bearer(value: bytes) -> list[bytes]:
    scheme, _, token = value.partition(b" ")
    return [token.strip()] if scheme.lower() == b"bearer" else []


# Each header that may carry a key, and the keys it carries.
_KEY_HEADERS = {
    b"x-api-key": lambda value: [value.strip()],
    b"x-api-keys": lambda value: [k.strip() for k in value.split(b",")],
    b"authorization": _bearer,
}


KeyRule = Literal["required", "ephemeral", "open"]


@dataclass(frozen=True)
class ServerKeys:
    """The keys a served task app accepts and where they came from.

    ``values is None`` means authentication is off (``--no-auth``); an empty tuple means keys
    are required but none is configured (every authenticated endpoint answers 503).
    """

    values: tuple[str, ...] | None
    source: str

    @property
    def primary(self) -> str | None:
        """The key clients should send (the first one), or None when there is none."""
        return self.values[0] if self.values else None

    def describe(self) -> str:
        """How the key is shown to people: masked, with its source."""
        if self.values is None:
            return "none: authentication is off (--no-auth)"
        return f"{mask(self.primary)} ({self.source})"

    def __repr__(self) -> str:
        return f"ServerKeys({self.describe()!r})"


def server_keys(env: Env, rule: KeyRule) -> ServerKeys:
    """The one rule for a missing ``ENVIRONMENT_API_KEY``, by the context serving the app.

    - ``"required"`` (serve, tunnel, deploy, the Modal container): the configured key and its
      aliases; none configured is a `UsageError` that says how to mint one.
    - ``"ephemeral"`` (smoke, eval and deploy's local validation, which serve an app for one
      run of their own): a key minted now and forgotten when the run ends.
    - ``"open"`` (``--no-auth``, asked for explicitly): no key; every endpoint answers anyone.
    """
    if rule == "open":
        return ServerKeys(None, "--no-auth")
    if rule == "ephemeral":
        return ServerKeys((mint_key(),), "an ephemeral key for this run")
    keys = env.api_keys()
    if not keys:
        raise UsageError(
            f"no {ENVIRONMENT_API_KEY} is configured, so the task app would refuse every "
            "request",
            hint="run `synth-deploy setup` to mint one into .env (or pass --env-file F); "
                 "pass --no-auth to serve without authentication on purpose")
    return ServerKeys(tuple(keys), f"{ENVIRONMENT_API_KEY} from "
                                   f"{env.source(ENVIRONMENT_API_KEY) or 'the environment'}")


class ApiKeyAuth:
    """Accepts a request when any presented key equals any configured key.

    ``keys=None`` accepts every request (authentication off); no keys at all answers 503.
    """

    def __init__(self, keys: Sequence[str] | None) -> None:
        self.enabled = keys is not None
        self._keys = [k.encode() for k in keys or () if k]

    def __repr__(self) -> str:
        return f"ApiKeyAuth(keys=<{len(self._keys)} hidden>)"

    def check(self, headers: RequestHeaders) -> AuthFailure | None:
        if not self.enabled:
            return None
        if not self._keys:
            return AuthFailure(503, "missing_environment_api_key", MISSING_KEY_MESSAGE)
        sent = presented_keys(headers)
        if not sent:
            return AuthFailure(
                401, "missing_api_key",
                "no API key sent: pass the task app's ENVIRONMENT_API_KEY in the X-API-Key "
                "header (or Authorization: Bearer)",
            )
        matched = False
        for candidate in sent:
            for valid in self._keys:
                # No early exit: the time taken does not depend on which key matched.
                matched |= hmac.compare_digest(candidate, valid)
        if matched:
            return None
        return AuthFailure(
            403, "invalid_api_key",
            "the API key sent does not match the server's ENVIRONMENT_API_KEY (or an alias in "
            "ENVIRONMENT_API_KEY_ALIASES); compare fingerprints with `synth-deploy check`",
        )


__all__ = ["ApiKeyAuth", "AuthFailure", "KeyRule", "MISSING_KEY_MESSAGE", "ServerKeys",
           "presented_keys", "server_keys"]
