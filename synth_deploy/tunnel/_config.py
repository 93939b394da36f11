"""`TunnelConfig`: what to expose and how, resolved once and checked once.

The CLI builds one from its flags and the resolved `Env` (``TUNNEL_TOKEN``, the cloudflared
binary found through ``CLOUDFLARED_PATH``); library callers build one directly::

    TunnelConfig("http://127.0.0.1:8001")                                    # quick tunnel
    TunnelConfig("http://127.0.0.1:8001", mode="named", token=token,
                 hostname="app.example.com", verify=False)

Every check on these settings lives in ``__post_init__``: nothing downstream validates again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from synth_deploy.errors import UsageError
from synth_deploy.tunnel._process import DEFAULT_LOG_LINES, ORPHAN_GUARDS
from synth_deploy.urls import http_url

Mode = Literal["quick", "named"]
MODES: tuple[Mode, ...] = ("quick", "named")
TUNNEL_TOKEN = "TUNNEL_TOKEN"  # the named tunnel's token: read from the Env, handed to cloudflared
DEFAULT_START_TIMEOUT_S = 30.0
DEFAULT_VERIFY_TIMEOUT_S = 60.0
DEFAULT_STOP_TIMEOUT_S = 5.0
DEFAULT_MAX_RESTARTS = 3


@dataclass(frozen=True)
class TunnelConfig:
    """What to expose and how; the token never appears in the repr.

    ``origin_url`` is the local server; `expose()` fills it in once the app it serves has a
    port, so it may be None until then. ``verify`` checks the public URL with the health
    checker before the tunnel counts as up (off for networks that cannot resolve the new
    hostname). ``binary`` is the cloudflared executable (None: looked up on PATH at start).
    ``orphan_guard`` picks how cloudflared dies with us on SIGKILL (see `TunnelProcess`).
    """

    origin_url: str | None = None
    mode: Mode = "quick"
    token: str | None = field(default=None, repr=False)
    hostname: str | None = None
    verify: bool = True
    binary: str | None = None
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S
    verify_timeout_s: float = DEFAULT_VERIFY_TIMEOUT_S
    stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S
    max_restarts: int = DEFAULT_MAX_RESTARTS
    orphan_guard: str = "auto"
    log_lines: int = DEFAULT_LOG_LINES

    def __post_init__(self) -> None:
        if self.origin_url is not None:
            url = http_url(self.origin_url, what="origin URL (--url)")
            object.__setattr__(self, "origin_url", url)
        if self.mode not in MODES:
            raise UsageError(f"tunnel mode {self.mode!r} is not quick or named",
                             hint="use --mode quick (no account) or --mode named")
        # "https://app.example.com/" and "app.example.com" name the same hostname.
        hostname = (self.hostname or "").strip().removeprefix("https://").strip("/") or None
        object.__setattr__(self, "hostname", hostname)
        if self.mode == "named":
            if not self.token:
                raise UsageError("a named tunnel needs its token",
                                 hint=f"pass --token or set {TUNNEL_TOKEN} (Cloudflare "
                                      "dashboard → Zero Trust → Networks → Tunnels)")
            if not self.hostname:
                raise UsageError("a named tunnel needs the public hostname routed to it",
                                 hint="pass --hostname app.example.com (see infra/tunnel.md)")
        if self.max_restarts < 0:
            raise UsageError(f"max_restarts must be >= 0, got {self.max_restarts}",
                             hint="0 gives up the first time cloudflared dies")
        if self.orphan_guard not in ORPHAN_GUARDS:
            raise UsageError(f"orphan_guard {self.orphan_guard!r} is not one of "
                             f"{', '.join(ORPHAN_GUARDS)}",
                             hint="leave it at 'auto' unless the platform's guard misbehaves")

    def for_origin(self, origin_url: str) -> TunnelConfig:
        """This config pointed at ``origin_url`` (checked like any other)."""
        return dataclasses.replace(self, origin_url=origin_url)

    def __repr__(self) -> str:
        shown = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        shown["token"] = "****" if self.token else None
        return f"TunnelConfig({', '.join(f'{k}={v!r}' for k, v in shown.items())})"


__all__ = [
    "DEFAULT_MAX_RESTARTS",
    "DEFAULT_START_TIMEOUT_S",
    "DEFAULT_VERIFY_TIMEOUT_S",
    "MODES",
    "TUNNEL_TOKEN",
    "Mode",
    "TunnelConfig",
]
