"""One TLS context for the kit's HTTP clients.

httpx builds a context per client, and building one loads the whole CA bundle: tens of
milliseconds each, several times in a `smoke` run (the rollout client, the served app's
policy client). The settings are httpx's defaults (certifi's bundle, or ``SSL_CERT_FILE`` /
``SSL_CERT_DIR``), made once; a context is safe to share between clients and threads.
"""

from __future__ import annotations

import functools
import ssl


@functools.cache
def client_ssl_context() -> ssl.SSLContext:
    """The verifying context every client of the kit uses (``httpx`` ``verify=`` it)."""
    import httpx

    return httpx.create_ssl_context()


__all__ = ["client_ssl_context"]
