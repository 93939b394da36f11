"""cloudflared tunnels for local development: a remote trainer reaching a laptop's task app.

    from synth_deploy.tunnel import Tunnel, TunnelConfig

    with Tunnel(TunnelConfig("http://127.0.0.1:8001"), api_key=key) as t:   # quick tunnel
        print(t.url)                    # https://….trycloudflare.com, verified healthy

    TunnelConfig("http://127.0.0.1:8001", mode="named", token=..., hostname="app.example.com")

`expose(runner_or_url, config)` serves a task app and tunnels to it in one step (what
`synth-deploy tunnel` runs); `concurrency_cap()` tells runners how hard they may drive a quick
tunnel. `TunnelProcess` owns one cloudflared child; `MetricsClient` reads its metrics server.
Importing this package costs the standard library and httpx only.

Errors (all `synth_deploy.errors.TunnelError`): `CloudflaredNotFoundError` (with the install
command for this OS), `TunnelRateLimitedError` (HTTP 429 on quick-tunnel creation), and plain
`TunnelError` carrying cloudflared's recent log lines in ``.logs``. Bad settings raise
`synth_deploy.errors.UsageError` from `TunnelConfig`.

Modules (private; import from here): ``_config`` (TunnelConfig), ``_tunnel`` (Tunnel, the
supervisor), ``_process`` (TunnelProcess), ``_exposed`` (expose, Exposed), ``_binary``
(finding cloudflared), ``_metrics`` (its metrics server and log lines), ``_limits``
(quick-tunnel concurrency), ``_errors``.
"""

from synth_deploy._lazy import lazy_attributes
from synth_deploy.tunnel._binary import CLOUDFLARED_PATH, find_cloudflared, install_hint
from synth_deploy.tunnel._config import TUNNEL_TOKEN, TunnelConfig
from synth_deploy.tunnel._errors import (
    CloudflaredNotFoundError,
    TunnelError,
    TunnelRateLimitedError,
)
from synth_deploy.tunnel._limits import (
    QUICK_TUNNEL_CONCURRENCY_CAP,
    QUICK_TUNNEL_INFLIGHT_LIMIT,
    TUNNEL_RESPONSE_TIMEOUT_S,
    concurrency_cap,
    is_quick_tunnel,
)
from synth_deploy.tunnel._process import TunnelProcess

# The supervisor and its metrics client load on first use: runs only ask `concurrency_cap`.
__getattr__ = lazy_attributes(__name__, {
    "Exposed": "_exposed", "expose": "_exposed", "MetricsClient": "_metrics",
    "parse_counters": "_metrics", "Tunnel": "_tunnel", "TunnelEvent": "_tunnel"})

__all__ = [
    "CLOUDFLARED_PATH",
    "QUICK_TUNNEL_CONCURRENCY_CAP",
    "QUICK_TUNNEL_INFLIGHT_LIMIT",
    "TUNNEL_RESPONSE_TIMEOUT_S",
    "TUNNEL_TOKEN",
    "CloudflaredNotFoundError",
    "Exposed",
    "MetricsClient",
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
    "parse_counters",
]
