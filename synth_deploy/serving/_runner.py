"""`LocalRunner`: the one place that turns resolved settings into a running task app.

    settings = ServeSettings.resolve("math", env, key_rule="required",
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

uvicorn is configured here and nowhere else (`_uvicorn_config`): every server the kit starts
runs uvicorn's fast path where installed (httptools, uvloop) with the same `ConnectionLimits`
(request deadlines, a connection cap answered with 503; see `_connections`), and no access
log unless asked. The Modal container serves the app built by `build()` behind Modal's own
front end. What a serving process changes for itself (its open-file limit, its garbage
collector) is changed by `prepare_serving_process`, called by the processes that only serve
(`serve`, the reload child, the container), never by building an app.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from synth_deploy.env import Env, applied_env, apply_env
from synth_deploy.errors import SynthDeployError, UsageError
from synth_deploy.serving._admission import (
    DRAIN_VAR,
    ConnectionLimits,
    RolloutLimits,
    rollout_limits,
    setting_from_env,
)
from synth_deploy.serving._auth import KeyRule, ServerKeys, server_keys
from synth_deploy.taskapp.config import DEFAULT_MAX_BODY_BYTES
from synth_deploy.taskapp.registry import TaskAppEntry, load_app

if TYPE_CHECKING:
    from synth_deploy.tracing import TraceDbSetting, TraceStore

DEFAULT_GRACEFUL_TIMEOUT_S = 30.0
DEFAULT_SUMMARY_EVERY_S = 10.0
_FILES_KEPT = 256  # open files a server keeps for itself: the trace store, clients, the app's
_YOUNG_GC_THRESHOLD = 7000  # see `prepare_serving_process`
_FULL_GC_EVERY = 100  # middle-generation collections between full ones (CPython's: 10)
logger = logging.getLogger("synth_deploy.taskapp")


def _open_file_limit() -> int:
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return 1024
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def prepare_serving_process() -> None:
    """What a process that only serves sets for itself, once: as many open files as the
    system allows it (a connection each), and a garbage collector that leaves alone what
    lives as long as the server.

    Frozen, the objects that exist once the app has started (modules, the app, its datasets)
    are not walked again by full collections; young collections wait for ten times as many
    new objects as by default, so the objects of rollouts in flight die before they are
    walked; and full collections come ten times less often: each walks every object the
    sessions and connections held hold (a server holding thousands of WebSocket sessions
    stopped for a long moment each time, bench/openenv_scaling.py), while what they free is
    what middle-generation collections missed.
    """
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY
                                                        else max(soft, 1 << 20), hard))
    except (ImportError, ValueError, OSError):  # not POSIX, or not allowed: keep the limit
        pass
    gc.freeze()
    young, middle, full = gc.get_threshold()
    gc.set_threshold(max(young, _YOUNG_GC_THRESHOLD), middle, max(full, _FULL_GC_EVERY))
    _give_back_large_blocks()


_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
_MMAP_FROM_BYTES = 128 * 1024  # glibc's default, before it starts moving it


def _give_back_large_blocks() -> None:
    """Keep glibc mapping blocks from 128 KiB on their own, so that they return to the
    system when freed. By default glibc raises that threshold each time such a block is
    freed (up to 32 MiB): from then on a client's large message or body comes from the
    heap, and the holes it leaves between smaller blocks that live on stay with the
    process, a server's memory kept long after the sessions that used it have closed."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (macOS): its allocator has its own rules
        return
    mallopt(_M_MMAP_THRESHOLD, _MMAP_FROM_BYTES)


def _uvicorn_config(app: Any, *, host: str, port: int, log_level: str,
                    graceful_timeout_s: float, limits: ConnectionLimits,
                    access_log: bool = False, **extra: Any) -> dict[str, Any]:
    """The keyword arguments of ``uvicorn.Config`` (and ``uvicorn.run``) for every server."""
    import functools

    from synth_deploy.serving._connections import FailedAuth, QuietWSProtocol, bounded_protocol

    if limits.max_connections is None:
        limits = replace(limits, max_connections=max(64, _open_file_limit() - _FILES_KEPT))

    # The client address a proxy forwards (X-Forwarded-For from cloudflared on 127.0.0.1) is
    # read by the access log alone: without it, nobody reads it and it is not parsed.
    extra.setdefault("proxy_headers", access_log)
    # OpenEnv's sessions (`_openenv`): uvicorn's sans-I/O protocol over websockets (framing
    # in C), its handshakes logged as access-log lines (`_client_log`).
    extra.setdefault("ws", QuietWSProtocol)
    # uvicorn holds a WebSocket message whole before the app sees it: capped as a body is.
    extra.setdefault("ws_max_size", _message_limit(app))
    # No "server: uvicorn" on every response: it tells a scanner what to try. The Date
    # header, which HTTP requires, stays.
    extra.setdefault("server_header", False)
    # A trainer may open thousands of connections at once: the kernel caps the queue of
    # those not yet accepted at its own limit (net.core.somaxconn).
    extra.setdefault("backlog", max(2048, min(65535, limits.max_connections)))
    # A task app's refusals without a key are answered by the protocol, before the app.
    keyless = getattr(getattr(app, "state", None), "keyless_refusal", None)
    return dict(app=app, host=host, port=port, log_level=log_level, access_log=access_log,
                timeout_graceful_shutdown=graceful_timeout_s,
                timeout_keep_alive=limits.keep_alive_s,  # type: ignore[arg-type]
                http=functools.partial(bounded_protocol(), limits=limits, keyless=keyless,
                                       failed_auth=FailedAuth()),
                **extra)


def _message_limit(app: Any) -> int:
    """The largest WebSocket message ``app`` takes: a task app's ``max_body_bytes``, else the
    kit's default (an app imported by name, the viewer, a mock policy)."""
    config = getattr(getattr(app, "state", None), "config", None)
    return getattr(config, "max_body_bytes", DEFAULT_MAX_BODY_BYTES)


@dataclass(frozen=True)
class ServeSettings:
    """What to serve and how, resolved at the entry point (the CLI or the container).

    The standard OTEL_* variables in ``env`` (OTEL_EXPORTER_OTLP_ENDPOINT...) turn on the live
    export of each rollout as spans (`synth_deploy.otel`), read once when the app is built.
    """

    app: str  # an app id or a task app file: what a reloaded process imports again
    env: Env
    keys: ServerKeys
    traces: TraceDbSetting | None = None  # None: rollouts are not recorded
    # Where traces end up, for /health: {"destination": str, "durable": bool} (default: the
    # store in ``traces``, durable unless in memory).
    trace_destination: Mapping[str, Any] | None = field(default=None, hash=False)
    host: str = "127.0.0.1"
    port: int = 0  # 0: any free port (thread mode)
    env_files: tuple[str, ...] = ()  # where ``env`` came from, for a reloaded process
    log_level: str = "info"
    graceful_timeout_s: float = DEFAULT_GRACEFUL_TIMEOUT_S
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    rollouts: RolloutLimits = RolloutLimits()  # see `rollout_limits` for where it comes from
    access_log: bool = False  # a line per request; `serve` prints a periodic summary instead
    summary_every_s: float | None = None  # `serve_forever`: a summary line that often

    @classmethod
    def resolve(cls, app: str, env: Env, *, key_rule: KeyRule,
                traces: TraceDbSetting | None, max_rollouts: int | None = None,
                head_after_s: float | None = None, heartbeat_s: float | None = None,
                **options: Any) -> ServeSettings:
        """The settings every entry point serves with (the CLI's commands, deploy's local
        check, the reload child, the Modal container), resolved in one place: the keys by
        ``key_rule`` (`server_keys`), the rollout limits from the flags given, else their
        variables in ``env`` (`rollout_limits`), the drain's bound from
        ``SYNTH_DEPLOY_DRAIN_S`` (default 30 s). ``traces``: the entry point's own trace
        setting (flags, the container's switch, the reload hand-off); ``options``: the other
        fields, as given."""
        drain_s = setting_from_env(env, DRAIN_VAR, float, "a number of seconds",
                                   "the seconds SIGTERM waits for rollouts in flight before "
                                   f"it cancels them, e.g. {DEFAULT_GRACEFUL_TIMEOUT_S:g}")
        if drain_s is not None:
            options.setdefault("graceful_timeout_s", drain_s)
        return cls(app=app, env=env, keys=server_keys(env, key_rule), traces=traces,
                   rollouts=rollout_limits(env, max_rollouts, head_after_s=head_after_s,
                                           heartbeat_s=heartbeat_s), **options)


def _destination(traces: TraceDbSetting | None) -> Mapping[str, Any] | None:
    if traces is None:
        return None
    return {"destination": traces.display, "durable": traces.url != ":memory:"}


class LocalRunner:
    """Owns one served task app: its entry, its ASGI app, its trace store and its server."""

    def __init__(self, settings: ServeSettings, *, rollout_records: Any = None) -> None:
        """``rollout_records``: where async rollouts' records are shared (a Modal
        deployment's Dict); else the trace store's, when there is one."""
        self.settings = settings
        self.rollout_records = rollout_records
        self.app: Any = None
        self.store: TraceStore | None = None
        self.live_export: Any = None  # synth_deploy.otel.LiveExporter, when OTEL_* ask for it
        self.serves_openenv = False  # the app declares an environment: /openenv (after build)
        self._entry: TaskAppEntry | None = None
        self._server: BackgroundServer | None = None
        self._restore_env: contextlib.ExitStack | None = None
        self._summarized_at = time.monotonic()  # the end of the last summary's window

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
        from synth_deploy.serving._server import create_app

        s = self.settings
        with applied_env(s.env):
            config = self.entry.build_config()
        self.serves_openenv = config.environment is not None
        records = None
        if s.traces is not None:
            from synth_deploy.tracing import RolloutRecords, open_trace_store

            self.store = open_trace_store(s.traces)
            try:  # rollouts are answered 200 once stored: not into a file readers refuse
                self.store.check_pages()
            except BaseException:
                self.store.close()
                self.store = None
                raise
            records = RolloutRecords(self.store)  # async rollouts outlive the process
        if self.rollout_records is not None:
            records = self.rollout_records
        self.live_export = _live_export(s.env)
        self.app = create_app(config, api_keys=s.keys.values, trace_store=self.store,
                              env=s.env, limits=s.rollouts, on_session=self.live_export.offer
                              if self.live_export is not None else None,
                              trace_destination=s.trace_destination or _destination(s.traces),
                              rollout_records=records)
        return self.app

    def stats(self) -> Mapping[str, int]:
        """Request counters of the served app (for live status lines); empty before build."""
        from synth_deploy.serving._server import stats_of

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
                                            graceful_timeout_s=5.0,
                                            limits=s.limits).start(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def request_stop(self) -> None:
        """Begin stopping the server without waiting; `stop` finishes the job."""
        if self._server is not None:
            self._server.request_stop()

    def stop(self) -> None:
        """Stop serving, flush and close the trace store, put ``os.environ`` back."""
        if self._server is not None:
            self._server.stop()
        if self.store is not None:
            self.store.close()
        if self.live_export is not None:
            self.live_export.close()
        if self._restore_env is not None:
            self._restore_env.close()
            self._restore_env = None

    def __enter__(self) -> LocalRunner:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- in the foreground (serve) --------------------------------------------------------

    def serve_forever(self, on_ready: Callable[[], None] | None = None) -> None:
        """Serve until SIGINT/SIGTERM, this process given to it (`prepare_serving_process`).
        ``on_ready`` is called once the port is bound; every ``summary_every_s`` a line sums
        up the rollouts. On SIGTERM uvicorn stops accepting connections and lets in-flight
        rollouts finish (at most ``graceful_timeout_s``), then returns."""
        import uvicorn

        from synth_deploy.serving._prompt_stop import PromptStopServer

        s = self.settings
        _ensure_port_free(s.host, s.port)
        apply_env(s.env)  # this process is the server: the app's variables stay for its life
        prepare_serving_process()
        app = self.build()

        def ready() -> None:
            gc.freeze()  # and what the app's startup made
            if s.summary_every_s:
                self._summarized_at = time.monotonic()
                asyncio.get_running_loop().create_task(self._summaries(s.summary_every_s))
            if on_ready is not None:
                on_ready()

        stats = app.state.stats

        def pending() -> str | None:
            n = stats.in_flight
            return f"{n} rollout{'' if n == 1 else 's'} in flight" if n else None

        def drained() -> None:  # the last window's rollouts, said before the process ends
            if s.summary_every_s and (line := stats.summary(
                    time.monotonic() - self._summarized_at)) is not None:
                logging.getLogger("uvicorn.error").info("%s", line)

        try:
            PromptStopServer(uvicorn.Config(**_uvicorn_config(
                app, host=s.host, port=s.port, log_level=s.log_level,
                graceful_timeout_s=s.graceful_timeout_s, limits=s.limits,
                access_log=s.access_log)), on_started=ready, pending=pending,
                on_drained=drained).run()
        finally:
            if self.store is not None:
                self.store.close()
            if self.live_export is not None:
                self.live_export.close()

    async def _summaries(self, every_s: float) -> None:
        stats = self.app.state.stats
        say = logging.getLogger("uvicorn.error")  # beside uvicorn's own lines
        while True:
            await asyncio.sleep(every_s)
            self._summarized_at = time.monotonic()
            if (line := stats.summary(every_s)) is not None:
                say.info("%s", line)

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
        uvicorn.run(**_uvicorn_config(
            f"{__name__}:reloaded_app", host=s.host, port=s.port, log_level=s.log_level,
            graceful_timeout_s=s.graceful_timeout_s, limits=s.limits, factory=True,
            access_log=s.access_log, reload=True,
            reload_dirs=[str(source.parent)] if source else None))


def _live_export(env: Env) -> Any:
    """The live OTLP exporter the OTEL_* variables in ``env`` ask for (see `synth_deploy.otel`);
    None when they do not, or when the OpenTelemetry packages are missing: then the app
    serves without spans, and says so once."""
    from synth_deploy.otel import (
        OTEL_EXTRA_HINT,
        LiveExporter,
        otel_installed,
        otlp_setting_from_env,
    )

    setting = otlp_setting_from_env(env)
    if setting is None:
        return None
    if not otel_installed():
        logger.warning("%s is set, but the OpenTelemetry packages are not installed: rollouts "
                       "are served without spans; %s", setting.source, OTEL_EXTRA_HINT)
        return None
    logger.info("rollouts are sent as spans to %s", setting.display)
    return LiveExporter(setting)


def reloaded_app() -> Any:
    """The reloader's factory: rebuild the app in a new process from the hand-off."""
    from synth_deploy.env import load_env
    from synth_deploy.handoff import ReloadHandoff
    from synth_deploy.tracing import parse_trace_db

    handoff = ReloadHandoff.from_environ(os.environ)
    env = load_env(handoff.env_files)
    traces = (parse_trace_db(handoff.trace_db, source=handoff.trace_source, env=env)
              if handoff.trace_db else None)
    settings = ServeSettings.resolve(handoff.app, env, traces=traces,
                                     key_rule=handoff.key_rule)  # type: ignore[arg-type]
    prepare_serving_process()
    return LocalRunner(settings).build()


class BackgroundServer:
    """uvicorn serving any ASGI ``app`` on a daemon thread::

        with BackgroundServer(create_mock_policy_app()) as server:
            httpx.get(server.url + "/v1/models")
    """

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 0,
                 log_level: str = "warning", graceful_timeout_s: float = 5.0,
                 limits: ConnectionLimits | None = None) -> None:
        import uvicorn

        from synth_deploy.serving._prompt_stop import PromptStopServer

        self.app = app
        self.host = host
        self._config = uvicorn.Config(**_uvicorn_config(
            app, host=host, port=port, log_level=log_level,
            graceful_timeout_s=graceful_timeout_s, limits=limits or ConnectionLimits(),
            lifespan="on"))
        self._server = PromptStopServer(self._config)
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

    def request_stop(self) -> None:
        """Begin stopping without waiting (servers asked together stop in the same time)."""
        self._server.request_stop()

    def stop(self, timeout_s: float = 10.0) -> None:
        self.request_stop()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(2.0)

    def wait(self) -> None:
        """Block until the server stops: the foreground mode of a command that only serves
        (`traces view`). Ctrl-C raises KeyboardInterrupt here, for the caller to stop it."""
        while self._thread is not None and self._thread.is_alive():
            self._thread.join(0.5)

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
        except OverflowError:
            raise UsageError(f"port {port} is out of range",
                             hint="pass --port between 1 and 65535") from None
        except OSError as exc:
            raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}",
                             hint="another server holds the port: stop it or pass --port") from None


__all__ = [
    "BackgroundServer",
    "ConnectionLimits",
    "DEFAULT_GRACEFUL_TIMEOUT_S",
    "LocalRunner",
    "ServeSettings",
    "prepare_serving_process",
    "reloaded_app",
]
