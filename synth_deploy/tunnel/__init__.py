"""cloudflared tunnels for local development: a remote trainer reaching a laptop's task app.

    from synth_deploy.tunnel import Tunnel

    with Tunnel(port=8001, api_key=key) as t:      # quick tunnel, no account needed
        print(t.url)                                 # https://….trycloudflare.com, verified

    Tunnel(port=8001, mode="named", token=..., hostname="app.example.com")   # stable name

`expose()` serves a task app and tunnels to it in one step (what `synth-deploy tunnel` runs);
`concurrency_cap()` tells runners how hard they may drive a quick tunnel. Importing this
package costs the standard library and httpx only.

Errors (all `synth_deploy.errors.TunnelError`): `CloudflaredNotFoundError` (with the install
command for this OS), `TunnelRateLimitedError` (HTTP 429 on quick-tunnel creation), and plain
`TunnelError` carrying cloudflared's recent log lines in ``.logs``.
"""

from synth_deploy.tunnel.binary import CLOUDFLARED_PATH, find_cloudflared, install_hint
from synth_deploy.tunnel.errors import (
    CloudflaredNotFoundError,
    TunnelError,
    TunnelRateLimitedError,
)
from synth_deploy.tunnel.expose import Exposed, expose
from synth_deploy.tunnel.limits import (
    QUICK_TUNNEL_CONCURRENCY_CAP,
    QUICK_TUNNEL_INFLIGHT_LIMIT,
    concurrency_cap,
    is_quick_tunnel,
)
from synth_deploy.tunnel.process import TunnelProcess
from synth_deploy.tunnel.tunnel import TUNNEL_TOKEN, Tunnel, TunnelConfig, TunnelEvent

__all__ = [
    "CLOUDFLARED_PATH",
    "QUICK_TUNNEL_CONCURRENCY_CAP",
    "QUICK_TUNNEL_INFLIGHT_LIMIT",
    "TUNNEL_TOKEN",
    "CloudflaredNotFoundError",
    "Exposed",
    "Tunnel",
    "TunnelConfig",
    "TunnelError",
    "TunnelEvent",
    "TunnelProcess",
    "TunnelRateLimitedError",
    "concurrency_cap",
    "expose",
    "find_cloudflared",
    "install_hint",
    "is_quick_tunnel",
]
