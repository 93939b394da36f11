"""How much concurrency a tunnel can carry.

Quick tunnels (``*.trycloudflare.com``) allow about 200 in-flight requests; beyond that
Cloudflare answers 429 and a rollout batch fails half-way. Runners ask :func:`concurrency_cap`
before fanning out. Pure functions, stdlib only: the smoke/eval runners import this cheaply.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from synth_deploy.proxy_limits import CLOUDFLARE_READ_TIMEOUT_S, QUICK_TUNNEL_INFLIGHT_LIMIT

QUICK_TUNNEL_DOMAIN = "trycloudflare.com"
# Half the documented limit: health probes and retries share the budget.
QUICK_TUNNEL_CONCURRENCY_CAP = 100
# Cloudflare answers 524 when the origin sends no response byte for this long.
TUNNEL_RESPONSE_TIMEOUT_S = CLOUDFLARE_READ_TIMEOUT_S


def is_quick_tunnel(url: str) -> bool:
    """True when ``url`` points at a Cloudflare quick tunnel."""
    host = (urlsplit(url if "//" in url else f"//{url}").hostname or "").lower()
    return host == QUICK_TUNNEL_DOMAIN or host.endswith("." + QUICK_TUNNEL_DOMAIN)


def concurrency_cap(url: str, requested: int) -> tuple[int, str | None]:
    """The concurrency to use against ``url``, and a warning when it was lowered.

    ``concurrency_cap("https://x.trycloudflare.com", 256) == (100, "...")``; any other URL, or
    a request within the cap, comes back unchanged with no warning.
    """
    if requested > QUICK_TUNNEL_CONCURRENCY_CAP and is_quick_tunnel(url):
        return QUICK_TUNNEL_CONCURRENCY_CAP, (
            f"{urlsplit(url).hostname} is a quick tunnel, which allows about "
            f"{QUICK_TUNNEL_INFLIGHT_LIMIT} in-flight requests; concurrency capped at "
            f"{QUICK_TUNNEL_CONCURRENCY_CAP} (was {requested}). Use a named tunnel "
            "(--mode named) or a Modal deployment for more.")
    return requested, None


__all__ = [
    "QUICK_TUNNEL_CONCURRENCY_CAP",
    "QUICK_TUNNEL_INFLIGHT_LIMIT",
    "TUNNEL_RESPONSE_TIMEOUT_S",
    "concurrency_cap",
    "is_quick_tunnel",
]
