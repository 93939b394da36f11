"""The local trace and eval viewer: a web page over a trace store, served on 127.0.0.1.

    with open_trace_store(setting, create=False) as store:
        serve_viewer(store, ViewerOptions(port=8765))     # until Ctrl-C; opens a browser tab
    create_viewer_app(store)                              # just the ASGI app (tests, bench)

Sessions (a paged, sorted, filtered table), rewards at a glance, one episode turn by turn,
two models or runs compared seed by seed, and SFT export of the filtered set. It only reads
the store. Every asset ships in this package (``static/``): no network, no build step.
Starlette and uvicorn load on first use, so the CLI's start-up does not pay for them.
"""

from synth_deploy._lazy import lazy_attributes
from synth_deploy.viewer._replay import content_parts, session_replay

_LAZY = {
    "create_viewer_app": "_app",
    "LOOPBACK_HOSTS": "_app",
    "DEFAULT_PORT": "_serve",
    "ViewerOptions": "_serve",
    "open_in_browser": "_serve",
    "serve_viewer": "_serve",
}

__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = [
    "DEFAULT_PORT",
    "LOOPBACK_HOSTS",
    "ViewerOptions",
    "content_parts",
    "create_viewer_app",
    "open_in_browser",
    "serve_viewer",
    "session_replay",
]
