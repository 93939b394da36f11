"""Serving the viewer in the foreground, through the kit's one server builder."""

from __future__ import annotations

import webbrowser
from collections.abc import Callable
from dataclasses import dataclass

from synth_deploy.tracing import TraceStore
from synth_deploy.urls import is_loopback_host
from synth_deploy.viewer._app import LOOPBACK_HOSTS, create_viewer_app

DEFAULT_PORT = 8765


@dataclass(frozen=True)
class ViewerOptions:
    """Where the viewer listens, and whether it opens a browser tab once it is up.

    ``port=0`` lets the OS choose a free port. A ``host`` other than a loopback address
    serves the traces to anyone who can reach it (and turns off the Host check); on loopback
    (127.0.0.0/8, ::1, localhost) the page answers only to loopback names and ``host``.
    """

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    open_browser: bool = True

    @property
    def loopback(self) -> bool:
        return is_loopback_host(self.host)

    @property
    def allowed_hosts(self) -> tuple[str, ...] | None:
        """The Host names the page answers (None: any, for a bind beyond loopback)."""
        return tuple(dict.fromkeys((*LOOPBACK_HOSTS, self.host))) if self.loopback else None


def serve_viewer(store: TraceStore, options: ViewerOptions = ViewerOptions(), *,
                 on_ready: Callable[[str], None] | None = None) -> None:
    """Serve the viewer over ``store`` until interrupted (KeyboardInterrupt propagates).

    ``on_ready(url)`` is called once the server is listening, before a browser is opened.
    """
    from synth_deploy.serving import BackgroundServer

    app = create_viewer_app(store, allowed_hosts=options.allowed_hosts)
    with BackgroundServer(app, host=options.host, port=options.port) as server:
        if on_ready is not None:
            on_ready(server.url)
        if options.open_browser:
            open_in_browser(server.url)
        server.wait()


def open_in_browser(url: str) -> bool:
    """Open ``url`` in a graphical browser if this machine has one; False otherwise (a
    console browser would take over the terminal, and a remote box has no screen)."""
    try:
        browser = webbrowser.get()
    except webbrowser.Error:
        return False
    if type(browser) is webbrowser.GenericBrowser:
        return False
    try:
        return bool(browser.open(url, new=2))
    except OSError:
        return False


__all__ = ["DEFAULT_PORT", "ViewerOptions", "open_in_browser", "serve_viewer"]
