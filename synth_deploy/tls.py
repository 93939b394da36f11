"""One TLS context for the kit's HTTP clients built on httpx.

httpx builds a context per client, and building one loads the whole CA bundle: tens of
milliseconds each, several times in a `smoke` run (the rollout client, the served app's
policy client). The settings are httpx's defaults (certifi's bundle, or ``SSL_CERT_FILE`` /
``SSL_CERT_DIR``), made once; a context is safe to share between clients and threads.

Every httpx client of the kit that may speak TLS verifies with it (tests/test_architecture.py
checks). `check`'s probes use the standard library's ``http.client`` (so that `check` starts
without importing httpx) with `stdlib_ssl_context`, which trusts the same certificates. The
tunnel's metrics client speaks plain HTTP to loopback; the OTLP exporter and libsql bring
their own.
"""

from __future__ import annotations

import functools
import os
import ssl


@functools.cache
def client_ssl_context() -> ssl.SSLContext:
    """The verifying context the kit's httpx clients use (``verify=`` it)."""
    import httpx

    return httpx.create_ssl_context()


def stdlib_ssl_context() -> ssl.SSLContext:
    """A verifying context for the standard library's clients, trusting what httpx trusts:
    ``SSL_CERT_FILE`` or ``SSL_CERT_DIR`` when set (a company's own CA), else certifi's
    bundle (some Python builds ship without system CA certificates)."""
    if cafile := os.environ.get("SSL_CERT_FILE"):
        return ssl.create_default_context(cafile=cafile)
    if capath := os.environ.get("SSL_CERT_DIR"):
        return ssl.create_default_context(capath=capath)
    try:
        import certifi
    except ImportError:
        return ssl.create_default_context()
    return ssl.create_default_context(cafile=certifi.where())


__all__ = ["client_ssl_context", "stdlib_ssl_context"]
