"""Running an ASGI app with uvicorn: in the foreground (`serve`) or on a thread.

`BackgroundServer` binds port 0 and reads back the port the OS chose, so nothing races for a
"free" port between probing and binding.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from synth_deploy.errors import SynthDeployError

DEFAULT_GRACEFUL_TIMEOUT_S = 30.0


class BackgroundServer:
    """uvicorn serving ``app`` on a daemon thread::

        with BackgroundServer(create_app(config)) as server:
            httpx.get(server.url + "/")
    """

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 0,
                 log_level: str = "warning", graceful_timeout_s: float = 5.0,
                 access_log: bool = False) -> None:
        import uvicorn

        self.app = app
        self.host = host
        self._config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                      access_log=access_log, lifespan="on",
                                      timeout_graceful_shutdown=graceful_timeout_s)
        self._server = uvicorn.Server(self._config)
        self._thread: threading.Thread | None = None
        self.port: int | None = port or None

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("server not started")
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 15.0) -> BackgroundServer:
        self._thread = threading.Thread(target=self._server.run, name="synth-deploy-uvicorn",
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                raise SynthDeployError(f"the local server failed to start on "
                                       f"{self.host}:{self._config.port}",
                                       hint="is the port already in use? see the log above")
            if time.monotonic() > deadline:
                self.stop()
                raise SynthDeployError(f"the local server did not start within {timeout_s:g}s")
            time.sleep(0.01)
        sockets = self._server.servers[0].sockets
        self.port = sockets[0].getsockname()[1]
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(2.0)

    def __enter__(self) -> BackgroundServer:
        return self.start() if self._thread is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(app: Any, *, host: str = "127.0.0.1", port: int = 8001, log_level: str = "info",
          graceful_timeout_s: float = DEFAULT_GRACEFUL_TIMEOUT_S) -> None:
    """Serve in the foreground until SIGINT/SIGTERM.

    On SIGTERM uvicorn stops accepting connections and lets in-flight rollouts finish, for at
    most ``graceful_timeout_s``, then exits.
    """
    import uvicorn

    uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                  timeout_graceful_shutdown=graceful_timeout_s)).run()


def ensure_port_free(host: str, port: int) -> None:
    """Fail early, with the fix, when ``host:port`` cannot be bound (uvicorn only logs it)."""
    import socket

    from synth_deploy.errors import UsageError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}",
                             hint="another server holds the port: stop it or pass --port") from None


# --reload needs an import string: the child re-imports the app from these variables.
_RELOAD_APP = "SYNTH_DEPLOY_RELOAD_APP"
_RELOAD_TRACES = "SYNTH_DEPLOY_RELOAD_TRACES"


def serve_with_reload(app_ref: str, *, host: str, port: int, reload_dirs: list[str],
                      trace_db: str | None = None, log_level: str = "info") -> None:
    """Serve with uvicorn's reloader; each reload re-imports the app (and reopens traces)."""
    import uvicorn

    os.environ[_RELOAD_APP] = app_ref
    os.environ[_RELOAD_TRACES] = trace_db or ""
    uvicorn.run("synth_deploy.taskapp.serving:_reload_factory", factory=True, host=host,
                port=port, reload=True, reload_dirs=reload_dirs, log_level=log_level,
                timeout_graceful_shutdown=DEFAULT_GRACEFUL_TIMEOUT_S)


def _reload_factory() -> Any:
    from synth_deploy.taskapp.registry import load_app
    from synth_deploy.taskapp.server import create_app

    store = None
    if trace_db := os.environ.get(_RELOAD_TRACES):
        from synth_deploy.env import load_env
        from synth_deploy.tracing import open_trace_store

        store = open_trace_store(trace_db, env=load_env())
    return create_app(load_app(os.environ[_RELOAD_APP]).build_config(), trace_store=store)


__all__ = [
    "BackgroundServer",
    "DEFAULT_GRACEFUL_TIMEOUT_S",
    "ensure_port_free",
    "serve",
    "serve_with_reload",
]
