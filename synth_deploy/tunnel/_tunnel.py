"""`Tunnel`: expose a local origin through cloudflared and keep it up.

    with Tunnel(TunnelConfig("http://127.0.0.1:8001"), api_key=key) as t:
        print(t.url)                    # https://….trycloudflare.com, verified healthy

Startup, each step bounded by a deadline that fires even if cloudflared prints nothing:
spawn cloudflared with a metrics server on a free loopback port → learn the hostname from
``/quicktunnel`` (named tunnels: the user's hostname) → wait for ``/ready`` → check the public
URL with the health checker, retrying while Cloudflare answers 530 or DNS catches up. A failed
start kills the child and raises `TunnelError` with its recent logs.

A supervisor thread owns the child for its whole life (Linux's parent-death signal is tied to
the spawning thread). When cloudflared dies it is restarted, at most ``max_restarts`` times in
a row, and ``on_event`` hears the new URL; quick tunnels get a new hostname on each start.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx

from synth_deploy.errors import TunnelError, UsageError
from synth_deploy.tunnel._binary import find_cloudflared
from synth_deploy.tunnel._config import TUNNEL_TOKEN, TunnelConfig
from synth_deploy.tunnel._errors import TunnelRateLimitedError
from synth_deploy.tunnel._metrics import (
    MetricsClient,
    free_loopback_port,
    last_error,
    quick_url_in,
    rate_limited,
)
from synth_deploy.tunnel._process import TunnelProcess

logger = logging.getLogger(__name__)
# A tunnel that stayed up this long earns a fresh set of restart attempts.
_STABLE_S = 60.0
# Failures that waiting will not fix: the app answered, and said no.
_DEFINITIVE_CODES = frozenset({"key_mismatch", "no_key", "server_key_missing",
                               "open_to_anyone", "schema_mismatch"})


@dataclass(frozen=True)
class TunnelEvent:
    """Something the supervisor saw: ready, died, restarting, restarted or failed."""

    kind: Literal["ready", "died", "restarting", "restarted", "failed"]
    url: str | None = None
    message: str = ""
    logs: tuple[str, ...] = ()
    at: float = field(default_factory=time.time)


class Tunnel:
    """A cloudflared tunnel to a local origin, verified, supervised, stopped on exit.

    ``config`` says what to expose and how (its ``origin_url`` must be set). ``api_key`` is
    what the health check sends; ``on_event`` hears every `TunnelEvent`, on the supervisor's
    thread. Seams for tests and unusual setups: ``command`` replaces the cloudflared
    executable (a list, e.g. ``[sys.executable, "standin"]``), ``env`` holds variables set for
    the child on top of the environment it inherits, ``resolve`` maps the public URL to the
    URL actually probed (only needed where the public hostname cannot resolve, i.e. never in
    production).
    """

    def __init__(self, config: TunnelConfig, *, api_key: str | None = None,
                 on_event: Callable[[TunnelEvent], None] | None = None,
                 command: Sequence[str] | None = None, env: Mapping[str, str] | None = None,
                 resolve: Callable[[str], str] | None = None) -> None:
        if config.origin_url is None:
            raise UsageError("the tunnel has no origin to expose",
                             hint="e.g. Tunnel(TunnelConfig('http://127.0.0.1:8001'))")
        self.config = config
        self.api_key = api_key
        self._on_event = on_event
        self._command = list(command) if command else None
        self._env = dict(env or {})
        self._resolve = resolve
        self._process: TunnelProcess | None = None
        self._metrics: MetricsClient | None = None
        self._supervisor: threading.Thread | None = None
        self._started = threading.Event()
        self._stopping = threading.Event()
        self._start_error: TunnelError | None = None
        self._up_since = 0.0
        self.url: str | None = None
        self.restarts = 0
        self.error: TunnelError | None = None

    # -- public ----------------------------------------------------------------------------

    def start(self) -> Tunnel:
        """Open the tunnel; returns once the public URL answers healthy (or raises)."""
        if self._supervisor is not None:
            raise RuntimeError("Tunnel already started")
        self._argv_prefix = self._command or [self.config.binary or find_cloudflared()]
        self._supervisor = threading.Thread(target=self._supervise, name="cloudflared-supervisor",
                                            daemon=True)
        _OPEN.add(self)
        self._supervisor.start()
        cfg = self.config
        try:
            # The supervisor enforces the real deadlines; this bound only guards against a bug.
            started = self._started.wait(cfg.start_timeout_s + cfg.verify_timeout_s + 30)
        except BaseException:  # Ctrl+C while starting: leave nothing running
            self.stop()
            raise
        if not started:
            self.stop()
            raise TunnelError("the tunnel supervisor did not report within its deadline",
                              logs=self.logs())
        if self._start_error is not None:
            _OPEN.discard(self)
            self._supervisor.join(cfg.stop_timeout_s + 5)
            raise self._start_error
        return self

    def stop(self) -> None:
        """Stop cloudflared (SIGTERM, then SIGKILL) and the supervisor. Idempotent."""
        self._stopping.set()
        _OPEN.discard(self)
        # Stop the child first: the supervisor notices at once instead of at its next poll.
        if self._process is not None:
            self._process.stop(self.config.stop_timeout_s)
        if self._supervisor is not None and self._supervisor is not threading.current_thread():
            self._supervisor.join(self.config.stop_timeout_s + 5)
        if self._metrics is not None:
            self._metrics.close()

    def __enter__(self) -> Tunnel:
        return self.start() if self._supervisor is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def hostname(self) -> str | None:
        return urlsplit(self.url).hostname if self.url else None

    @property
    def process(self) -> TunnelProcess | None:
        """The current cloudflared child (a new one after each restart)."""
        return self._process

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.alive and self.error is None

    def logs(self, last: int | None = None) -> list[str]:
        """cloudflared's recent log lines, secrets redacted."""
        return self._process.logs(last) if self._process is not None else []

    def counters(self) -> dict[str, float]:
        """requests, errors, in_flight, connections as cloudflared counts them; empty when
        they cannot be read (never an exception: status loops call this from other threads,
        and a restart may retire the metrics client being read)."""
        metrics = self._metrics
        return metrics.counters() if metrics is not None and self.alive else {}

    def __repr__(self) -> str:
        return f"Tunnel(url={self.url!r}, config={self.config!r}, restarts={self.restarts})"

    # -- supervisor ------------------------------------------------------------------------

    def _supervise(self) -> None:
        try:
            try:
                self._launch()
            except BaseException as exc:  # whatever it was, start() must hear of it
                self._start_error = self._as_tunnel_error(exc, "the tunnel failed to start")
                return
            finally:
                self._started.set()
            self._emit("ready", "tunnel ready")
            self._keep_up()
        except BaseException as exc:  # a dead supervisor must leave an error, not silence
            self.error = self._as_tunnel_error(exc, "the tunnel supervisor failed")
            self._emit("failed", self.error.message, self.logs(20))
        finally:
            if self._process is not None:
                self._process.stop(self.config.stop_timeout_s)

    def _keep_up(self) -> None:
        attempts = 0
        while not self._stopping.is_set():
            proc = self._process
            assert proc is not None
            if proc.wait(0.2) is None or self._stopping.is_set():
                continue
            if time.monotonic() - self._up_since > _STABLE_S:
                attempts = 0
            self._emit("died", f"cloudflared exited with code {proc.returncode}",
                       proc.logs(20))
            relaunched = self._relaunch(attempts)
            if relaunched is None:
                return
            attempts = relaunched
            self.restarts += 1
            self._emit("restarted", f"tunnel restarted: {self.url}")

    def _relaunch(self, attempts: int) -> int | None:
        """Start cloudflared again, backing off between tries; the restarts counted so far,
        or None when supervision ends (restarts used up, or the tunnel is stopping)."""
        while True:
            attempts += 1
            if attempts > self.config.max_restarts:
                self.error = TunnelError(
                    f"cloudflared died and {self.config.max_restarts} restart(s) did not "
                    f"bring the tunnel back", logs=self.logs(),
                    hint="see cloudflared's log lines; check this machine's network")
                self._emit("failed", self.error.message, self.logs(20))
                return None
            if self._stopping.wait(min(0.5 * 2 ** (attempts - 1), 5.0)):
                return None
            self._emit("restarting", f"restart {attempts} of {self.config.max_restarts}")
            try:
                self._launch()
                return attempts
            except TunnelError as exc:
                if self._stopping.is_set():
                    return None
                self._emit("died", exc.message, tuple(exc.logs[-20:]))

    def _as_tunnel_error(self, exc: BaseException, what: str) -> TunnelError:
        if isinstance(exc, TunnelError):
            return exc
        error = TunnelError(f"{what}: {type(exc).__name__}: {exc}", logs=self.logs(),
                            hint="an unexpected error in synth-deploy or in a callback given "
                                 "to Tunnel, not cloudflared's; its traceback is chained")
        error.__cause__ = exc
        return error

    def _emit(self, kind: Any, message: str, logs: Sequence[str] = ()) -> None:
        if self._on_event is not None:
            try:
                self._on_event(TunnelEvent(kind, self.url, message, tuple(logs)))
            except Exception:  # a broken callback must not end supervision
                logger.exception("tunnel on_event callback failed")

    def _launch(self) -> None:
        cfg = self.config
        metrics_address = f"127.0.0.1:{free_loopback_port()}"
        child_env = dict(self._env)
        argv = [*self._argv_prefix, "tunnel", "--no-autoupdate", "--config", os.devnull,
                "--metrics", metrics_address]
        if cfg.mode == "quick":
            argv += ["--url", cfg.origin_url]
        else:
            # In the environment, not argv: other users can read argv with `ps`.
            argv += ["run"]
            child_env[TUNNEL_TOKEN] = cfg.token or ""
        proc = TunnelProcess(argv, env=child_env, secrets=[cfg.token or ""],
                             log_lines=cfg.log_lines, orphan_guard=cfg.orphan_guard).start()
        metrics = MetricsClient(metrics_address)
        previous, self._process = self._metrics, proc
        try:
            hostname = self._wait_for_edge(proc, metrics,
                                           time.monotonic() + cfg.start_timeout_s)
            url = f"https://{hostname}"
            if cfg.verify:
                self._verify(proc, url, time.monotonic() + cfg.verify_timeout_s)
        except BaseException:
            proc.stop(cfg.stop_timeout_s)
            metrics.close()
            raise
        self._metrics, self.url, self._up_since = metrics, url, time.monotonic()
        if previous is not None:
            previous.close()

    def _wait_for_edge(self, proc: TunnelProcess, metrics: MetricsClient,
                       deadline: float) -> str:
        cfg = self.config
        hostname = cfg.hostname if cfg.mode == "named" else None
        listening = False
        connections = 0
        while True:
            self._check_starting(proc)
            try:
                if hostname is None:
                    hostname = metrics.quick_tunnel_hostname()
                readiness = metrics.readiness()
                listening, connections = True, readiness.connections
                if hostname is None:  # older versions: only the banner names it
                    hostname = _banner_hostname(proc)
                if readiness.ready and hostname:
                    return hostname
            except httpx.TransportError:
                pass  # metrics server not listening yet
            if time.monotonic() >= deadline:
                break
            proc.wait(0.1)
        raise self._edge_error(proc, listening, hostname, connections)

    def _check_starting(self, proc: TunnelProcess) -> None:
        """`TunnelError` when the tunnel was stopped or cloudflared died while starting."""
        if self._stopping.is_set():
            raise TunnelError("the tunnel was stopped while starting", logs=proc.logs())
        if not proc.alive:
            raise _exit_error(proc)

    def _edge_error(self, proc: TunnelProcess, listening: bool, hostname: str | None,
                    connections: int) -> TunnelError:
        """Which step of reaching Cloudflare's edge did not happen in time, with the logs."""
        logs = proc.logs()
        if not listening:
            what = "did not open its metrics server"
        elif hostname is None:
            what = "did not report a quick-tunnel hostname"
        else:
            what = f"did not register a connection to Cloudflare's edge (ready={connections})"
        return TunnelError(
            f"cloudflared {what} within {self.config.start_timeout_s:g}s"
            + (f"; last log line: {last_error(logs)}" if logs else " and logged nothing"),
            hint="check that this machine can reach Cloudflare's edge on port 7844 (UDP for "
                 "QUIC, TCP for http2); the log lines say more", logs=logs)

    def _verify(self, proc: TunnelProcess, url: str, deadline: float) -> None:
        from synth_deploy.health import CheckOptions, check

        interval = 0.25
        while True:
            # Resolved on every attempt: a fresh hostname's DNS appears while we wait.
            probe = self._resolve(url) if self._resolve is not None else url
            self._check_starting(proc)
            remaining = deadline - time.monotonic()
            options = CheckOptions(timeout_s=max(1.0, min(5.0, remaining)))
            report = check(probe, self.api_key, options)
            if report.healthy:
                return
            failure = report.failure
            definitive = failure is not None and failure.code in _DEFINITIVE_CODES
            if definitive or time.monotonic() + interval >= deadline:
                break
            self._stopping.wait(interval)
            interval = min(interval * 2, 1.0)
        raise self._unhealthy_error(proc, url, failure, definitive)

    def _unhealthy_error(self, proc: TunnelProcess, url: str, failure: Any,
                         definitive: bool) -> TunnelError:
        """The public URL never answered healthy: the check that failed and its fix."""
        where = f"{failure.name}: {failure.actual}" if failure else "no checks ran"
        waited = "" if definitive else f" within {self.config.verify_timeout_s:g}s"
        return TunnelError(
            f"the tunnel is up but {url} did not answer healthy{waited} ({where})",
            hint=(failure.hint if failure and failure.hint else
                  f"check that the app answers at {self.config.origin_url}"),
            logs=proc.logs())


_OPEN: weakref.WeakSet[Tunnel] = weakref.WeakSet()


@atexit.register
def _stop_open_tunnels() -> None:
    # Registered after _process.py's reaper, so it runs first: supervisors must stand down
    # before their children are reaped, or they would "restart" them during shutdown.
    for tunnel in list(_OPEN):
        tunnel.stop()


def _banner_hostname(proc: TunnelProcess) -> str | None:
    """The quick tunnel's hostname from cloudflared's banner, when its log has shown it."""
    banner = quick_url_in(proc.logs())
    return urlsplit(banner).hostname if banner else None


def _exit_error(proc: TunnelProcess) -> TunnelError:
    logs = proc.logs()
    if rate_limited(logs):
        return TunnelRateLimitedError(
            "Cloudflare is rate-limiting quick-tunnel creation from this address (HTTP 429)",
            hint="wait a few minutes before opening another quick tunnel, or use a named "
                 "tunnel (--mode named --token … --hostname …)", logs=logs)
    detail = last_error(logs)
    return TunnelError(
        f"cloudflared exited with code {proc.returncode} before the tunnel was ready"
        + (f": {detail}" if detail else " without logging anything"),
        hint="see cloudflared's log lines above; an old cloudflared may need an upgrade",
        logs=logs)


__all__ = ["Tunnel", "TunnelEvent"]
