"""`LocalRunner`: the one place that turns resolved settings into a running task app.

    settings = ServeSettings(app="math", env=env, keys=server_keys(env, "required"),
                             traces=resolve_trace_db(None, env))
    with LocalRunner(settings) as runner:      # on a thread; port 0 lets the OS choose
        httpx.get(runner.url + "/health", headers={"X-API-Key": settings.keys.primary})
    LocalRunner(settings).serve_forever()      # foreground (`serve`): SIGTERM drains rollouts
    LocalRunner(settings).serve_with_reload()  # uvicorn's reloader (`serve --reload`)
    LocalRunner(settings).build()              # just the ASGI app (the Modal container)

Every command that serves an app (`serve`, `smoke`/`eval`, `tunnel`, deploy's local
validation, the reload child and the Modal container) goes through `build()`: the app's
variables applied to ``os.environ`` (app code reads them there, as in its container), the
config built, the trace store opened from its resolved setting, `create_app`.

`BackgroundServer` runs any ASGI app with uvicorn on a thread (the runner, the mock policy);
it binds port 0 and reads back the port the OS chose, so nothing races for a "free" port.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from synth_deploy.env import Env, applied_env, apply_env
from synth_deploy.errors import SynthDeployError, UsageError
from synth_deploy.taskapp._auth import ServerKeys, server_keys
from synth_deploy.taskapp._registry import TaskAppEntry, load_app

if TYPE_CHECKING:
    from synth_deploy.tracing import TraceDbSetting, TraceStore

DEFAULT_GRACEFUL_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ServeSettings:
    """What to serve and how, resolved at the entry point (the CLI or the container)."""

    app: str  # an app id or a task app file: what a reloaded process imports again
    env: Env
    keys: ServerKeys
    traces: TraceDbSetting | None = None  # None: rollouts are not recorded
    host: str = "127.0.0.1"
    port: int = 0  # 0: any free port (thread mode)
    env_files: tuple[str, ...] = ()  # where ``env`` came from, for a reloaded process
    log_level: str = "info"
    graceful_timeout_s: float = DEFAULT_GRACEFUL_TIMEOUT_S


class LocalRunner:
    """Owns one served task app: its entry, its ASGI app, its trace store and its server."""

    def __init__(self, settings: ServeSettings) -> None:
        self.settings = settings
        self.app: Any = None
        self.store: TraceStore | None = None
        self._entry: TaskAppEntry | None = None
        self._server: BackgroundServer | None = None
        self._restore_env: contextlib.ExitStack | None = None

    @property
    def entry(self) -> TaskAppEntry:
        """The registered task app (its file imported once, with the app's variables set)."""
        if self._entry is None:
            with applied_env(self.settings.env):
                self._entry = load_app(self.settings.app)
        return self._entry

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the runner is not serving on a thread")
        return self._server.url

    def build(self) -> Any:
        """The task app's ASGI app (built once; opens the trace store when one is set)."""
        if self.app is not None:
            return self.app
        from synth_deploy.taskapp._server import create_app

        s = self.settings
        with applied_env(s.env):
            config = self.entry.build_config()
        if s.traces is not None:
            from synth_deploy.tracing import open_trace_store

            self.store = open_trace_store(s.traces)
        self.app = create_app(config, api_keys=s.keys.values, trace_store=self.store,
                              env=s.env)
        return self.app

    def stats(self) -> Mapping[str, int]:
        """Request counters of the served app (for live status lines); empty before build."""
        from synth_deploy.taskapp._server import stats_of

        return stats_of(self.app) if self.app is not None else {}

    # -- on a thread (smoke, eval, tunnel, deploy's validation) ---------------------------

    def start(self, timeout_s: float = 15.0) -> LocalRunner:
        """Serve on a thread; the app's variables stay applied until `stop()`."""
        s = self.settings
        _ensure_port_free(s.host, s.port)
        self._restore_env = contextlib.ExitStack()
        self._restore_env.enter_context(applied_env(s.env))
        try:
            self._server = BackgroundServer(self.build(), host=s.host, port=s.port,
                                            graceful_timeout_s=5.0).start(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop serving, flush and close the trace store, put ``os.environ`` back."""
        if self._server is not None:
            self._server.stop()
        if self.store is not None:
            self.store.close()
        if self._restore_env is not None:
            self._restore_env.close()
            self._restore_env = None

    def __enter__(self) -> LocalRunner:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- in the foreground (serve) --------------------------------------------------------

    def serve_forever(self) -> None:
        """Serve until SIGINT/SIGTERM. On SIGTERM uvicorn stops accepting connections and
        lets in-flight rollouts finish (at most ``graceful_timeout_s``), then returns."""
        import uvicorn

        s = self.settings
        _ensure_port_free(s.host, s.port)
        apply_env(s.env)  # this process is the server: the app's variables stay for its life
        try:
            uvicorn.Server(uvicorn.Config(self.build(), host=s.host, port=s.port,
                                          log_level=s.log_level,
                                          timeout_graceful_shutdown=s.graceful_timeout_s)).run()
        finally:
            if self.store is not None:
                self.store.close()

    def serve_with_reload(self) -> None:
        """Serve under uvicorn's reloader: on each change to the app's folder a new process
        imports the app again, through `ReloadHandoff` (keys and traces by the same rules)."""
        import uvicorn

        from synth_deploy.handoff import ReloadHandoff

        s = self.settings
        _ensure_port_free(s.host, s.port)
        source = self.entry.source
        handoff = ReloadHandoff(
            app=str(source) if source is not None else s.app, env_files=s.env_files,
            key_rule="open" if s.keys.values is None else "required",
            trace_db=s.traces.url if s.traces is not None else None,
            trace_source=s.traces.source if s.traces is not None else "--trace-db")
        apply_env(s.env)
        os.environ.update(handoff.to_environ())
        uvicorn.run(f"{__name__}:reloaded_app", factory=True, host=s.host, port=s.port,
                    reload=True, reload_dirs=[str(source.parent)] if source else None,
                    log_level=s.log_level, timeout_graceful_shutdown=s.graceful_timeout_s)


def reloaded_app() -> Any:
    """The reloader's factory: rebuild the app in a new process from the hand-off."""
    from synth_deploy.env import load_env
    from synth_deploy.handoff import ReloadHandoff
    from synth_deploy.tracing import parse_trace_db

    handoff = ReloadHandoff.from_environ(os.environ)
    env = load_env(handoff.env_files)
    traces = (parse_trace_db(handoff.trace_db, source=handoff.trace_source, env=env)
              if handoff.trace_db else None)
    settings = ServeSettings(app=handoff.app, env=env, traces=traces,
                             keys=server_keys(env, handoff.key_rule))  # type: ignore[arg-type]
    return LocalRunner(settings).build()


class BackgroundServer:
    """uvicorn serving any ASGI ``app`` on a daemon thread::

        with BackgroundServer(create_mock_policy_app()) as server:
            httpx.get(server.url + "/v1/models")
    """

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 0,
                 log_level: str = "warning", graceful_timeout_s: float = 5.0) -> None:
        import uvicorn

        self.app = app
        self.host = host
        self._config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                      access_log=False, lifespan="on",
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


def _ensure_port_free(host: str, port: int) -> None:
    """Fail early, with the fix, when ``host:port`` cannot be bound (uvicorn only logs it)."""
    if not port:
        return
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}",
                             hint="another server holds the port: stop it or pass --port") from None


__all__ = [
    "BackgroundServer",
    "DEFAULT_GRACEFUL_TIMEOUT_S",
    "LocalRunner",
    "ServeSettings",
    "reloaded_app",
]
