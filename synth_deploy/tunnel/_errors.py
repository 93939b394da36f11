"""The tunnel's errors, all under :class:`synth_deploy.errors.TunnelError`.

    TunnelError                      cloudflared failed to start, became unreachable or died
     ├── CloudflaredNotFoundError    no binary on PATH or at CLOUDFLARED_PATH (install hint)
     └── TunnelRateLimitedError      Cloudflare refused a new quick tunnel (HTTP 429)
"""

from __future__ import annotations

from synth_deploy.errors import TunnelError


class CloudflaredNotFoundError(TunnelError):
    """cloudflared is not installed where we look; ``hint`` holds the install command."""


class TunnelRateLimitedError(TunnelError):
    """Cloudflare answered 429 when asked for a quick tunnel."""


__all__ = ["CloudflaredNotFoundError", "TunnelError", "TunnelRateLimitedError"]
