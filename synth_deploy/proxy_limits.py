"""What the proxies between a trainer and a task app allow, as their own docs state it: the
one place the kit's messages (timeout layers, tunnel caps) and the test stand-ins of these
proxies (tests/standins/cutoff_proxies.py) read it from.

- Cloudflare (quick and named tunnels): no response byte for ``CLOUDFLARE_READ_TIMEOUT_S``
  and the edge answers 524 (its proxy read timeout). A quick tunnel (``*.trycloudflare.com``)
  also answers 429 past ``QUICK_TUNNEL_INFLIGHT_LIMIT`` requests in flight and does not
  carry server-sent events.
- Modal web endpoints: a call not finished within ``MODAL_WEB_REDIRECT_S`` is answered 303
  to a result URL that blocks up to as long again (then another 303); only a
  ``text/event-stream`` body is relayed as it is written, any other body is not promised to
  arrive before it is complete.
- Clients that follow those 303s stop after so many hops: httpx after
  ``HTTPX_MAX_REDIRECTS``; Python's urllib after ``URLLIB_MAX_REPEATS`` to the same URL.
"""

from __future__ import annotations

CLOUDFLARE_READ_TIMEOUT_S = 125
QUICK_TUNNEL_INFLIGHT_LIMIT = 200
MODAL_WEB_REDIRECT_S = 150
HTTPX_MAX_REDIRECTS = 20
URLLIB_MAX_REPEATS = 4

__all__ = ["CLOUDFLARE_READ_TIMEOUT_S", "HTTPX_MAX_REDIRECTS", "MODAL_WEB_REDIRECT_S",
           "QUICK_TUNNEL_INFLIGHT_LIMIT", "URLLIB_MAX_REPEATS"]
