"""`expose()`: serve a task app (or take a running one) and tunnel to it, in one step.

This is what `synth-deploy tunnel` runs. The order is chosen to fail fast: cloudflared is found
and the settings are validated before anything is served, so a missing binary costs
milliseconds, not an app import.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from synth_deploy.env import TASK_APP_URL
from synth_deploy.errors import UsageError
from synth_deploy.tunnel.limits import (
    QUICK_TUNNEL_CONCURRENCY_CAP,
    QUICK_TUNNEL_INFLIGHT_LIMIT,
)
from synth_deploy.tunnel.tunnel import (
    DEFAULT_MAX_RESTARTS,
    DEFAULT_START_TIMEOUT_S,
    DEFAULT_VERIFY_TIMEOUT_S,
    Mode,
    Tunnel,
    TunnelConfig,
    TunnelEvent,
)


@dataclass
class Exposed:
    """A task app reachable through a tunnel; live while the `expose()` block runs."""

    tunnel: Tunnel
    local_url: str
    app_id: str | None = None
    env_file: Path | None = None
    warnings: list[str] = field(default_factory=list)
    started_at: float = field(default_factory=time.monotonic)
    _runner: Any = None
    _events: list[TunnelEvent] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        """The public URL (it changes when a quick tunnel is restarted)."""
        assert self.tunnel.url is not None
        return self.tunnel.url

    @property
    def error(self) -> Exception | None:
        """Set when cloudflared died and could not be restarted."""
        return self.tunnel.error

    def drain_events(self) -> list[TunnelEvent]:
        """Events since the last call: died, restarting, restarted, failed."""
        with self._lock:
            events, self._events[:] = list(self._events), []
        return events

    def stats(self) -> dict[str, float]:
        """requests, rollout_requests, rollouts, errors, in_flight, restarts, uptime_s.

        ``requests`` is what cloudflared counted coming through the tunnel, every endpoint
        (0 while it reports nothing); ``rollout_requests`` (POST /rollout received, refused ones
        included), ``rollouts`` (completed) and errors are the app's counts when we serve it.
        """
        edge = self.tunnel.counters()
        app: Mapping[str, int] = self._runner.stats() if self._runner is not None else {}
        return {
            "requests": edge.get("requests", 0),
            "rollout_requests": app.get("rollout_requests", 0),
            "rollouts": app.get("rollouts", 0),
            "errors": app.get("errors", 0) + edge.get("errors", 0),
            "in_flight": max(app.get("in_flight", 0), edge.get("in_flight", 0)),
            "restarts": self.tunnel.restarts,
            "uptime_s": time.monotonic() - self.started_at,
        }

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.tunnel.url, "local_url": self.local_url, "app": self.app_id,
                "mode": self.tunnel.config.mode,
                "env_file": str(self.env_file) if self.env_file else None,
                "warnings": list(self.warnings)}

    def _record(self, event: TunnelEvent) -> None:
        if event.kind == "restarted" and self.env_file is not None and event.url:
            from synth_deploy.env import write_env_var

            write_env_var(self.env_file, TASK_APP_URL, event.url)
        with self._lock:
            self._events.append(event)


@contextmanager
def expose(runner: Any = None, *, url: str | None = None, api_key: str | None = None,
           mode: Mode = "quick", token: str | None = None, hostname: str | None = None,
           binary: str | None = None, write_env: str | Path | None = ".env",
           verify: bool = True, start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
           verify_timeout_s: float = DEFAULT_VERIFY_TIMEOUT_S,
           max_restarts: int = DEFAULT_MAX_RESTARTS,
           on_event: Callable[[TunnelEvent], None] | None = None,
           tunnel_options: Mapping[str, Any] | None = None) -> Iterator[Exposed]:
    """Serve ``runner`` (a `synth_deploy.taskapp.LocalRunner`) on 127.0.0.1, or take the
    server at ``url``, and open a tunnel to it; write ``TASK_APP_URL`` into ``write_env``;
    stop both on exit.

    ``api_key`` is what the tunnel's health check sends (default: the runner's key);
    ``tunnel_options`` go to `Tunnel` unchanged (``command``, ``env``, ``resolve`` seams).
    """
    from synth_deploy.env import write_env_var

    if (runner is None) == (url is None):
        raise UsageError("name a task app to serve, or --url of a server already running",
                         hint="synth-deploy tunnel math   or   synth-deploy tunnel --url "
                              "http://127.0.0.1:8001")
    options = dict(tunnel_options or {})
    if "command" not in options:
        from synth_deploy.tunnel.binary import find_cloudflared

        options["binary"] = binary or find_cloudflared()
    # Validate the tunnel settings now, before an app is imported and served.
    TunnelConfig(origin_url=url or "http://127.0.0.1:1", mode=mode, token=token,
                 hostname=hostname, max_restarts=max_restarts)

    with ExitStack() as stack:
        app_id = None
        if runner is not None:
            stack.enter_context(runner)
            url, app_id = runner.url, runner.entry.app_id
            api_key = api_key or runner.settings.keys.primary
        assert url is not None
        holder: list[Exposed] = []

        def record(event: TunnelEvent) -> None:
            if holder:
                holder[0]._record(event)
            if on_event is not None:
                on_event(event)

        tunnel = Tunnel(url=url, mode=mode, token=token, hostname=hostname, api_key=api_key,
                        verify=verify, start_timeout_s=start_timeout_s,
                        verify_timeout_s=verify_timeout_s, max_restarts=max_restarts,
                        on_event=record, **options)
        exposed = Exposed(tunnel, url.rstrip("/"), app_id, _runner=runner)
        holder.append(exposed)
        stack.enter_context(tunnel)
        if mode == "quick":
            exposed.warnings.append(
                f"quick tunnels allow about {QUICK_TUNNEL_INFLIGHT_LIMIT} requests in flight: "
                f"smoke/eval runners cap their concurrency at {QUICK_TUNNEL_CONCURRENCY_CAP} "
                "for trycloudflare.com URLs; set the trainer's concurrency likewise")
        else:
            exposed.warnings.append(
                f"named tunnel: {hostname}'s service in the Cloudflare dashboard must be "
                f"{exposed.local_url}")
        if write_env:
            exposed.env_file = write_env_var(write_env, TASK_APP_URL, exposed.url)
        yield exposed


__all__ = ["Exposed", "expose"]
