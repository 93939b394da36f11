"""`expose()` and the `Exposed` app it yields: serve a task app (or take a running one) and
tunnel to it, in one step.

This is what `synth-deploy tunnel` runs. The order is chosen to fail fast: the caller has found
cloudflared and built the `TunnelConfig` (which checks itself) before anything is served, so a
missing binary or a bad flag costs milliseconds, not an app import.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from synth_deploy.env import TASK_APP_URL, write_env_var
from synth_deploy.tunnel._binary import find_cloudflared
from synth_deploy.tunnel._config import TunnelConfig
from synth_deploy.tunnel._limits import (
    QUICK_TUNNEL_CONCURRENCY_CAP,
    QUICK_TUNNEL_INFLIGHT_LIMIT,
)
from synth_deploy.tunnel._tunnel import Tunnel, TunnelEvent

if TYPE_CHECKING:
    from synth_deploy.serving import LocalRunner


@dataclass
class Exposed:
    """A task app reachable through a tunnel; live while the `expose()` block runs."""

    tunnel: Tunnel
    local_url: str
    app_id: str | None = None
    env_file: Path | None = None
    warnings: list[str] = field(default_factory=list)
    started_at: float = field(default_factory=time.monotonic)
    _runner: LocalRunner | None = None
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
        """What `synth-deploy tunnel --json` reports when the tunnel is ready."""
        return {"url": self.tunnel.url, "local_url": self.local_url, "app": self.app_id,
                "mode": self.tunnel.config.mode,
                "env_file": str(self.env_file) if self.env_file else None,
                "warnings": list(self.warnings)}

    def _record(self, event: TunnelEvent) -> None:
        if event.kind == "restarted" and self.env_file is not None and event.url:
            write_env_var(self.env_file, TASK_APP_URL, event.url)
        with self._lock:
            self._events.append(event)


@contextmanager
def expose(origin: LocalRunner | str, config: TunnelConfig | None = None, *,
           api_key: str | None = None, write_env: str | Path | None = ".env",
           on_event: Callable[[TunnelEvent], None] | None = None,
           **seams: Any) -> Iterator[Exposed]:
    """Serve ``origin`` (a `synth_deploy.serving.LocalRunner`) on 127.0.0.1, or take the
    server already running at ``origin`` (a URL), and open a tunnel to it as ``config`` says
    (its ``origin_url`` is set to the served URL); write ``TASK_APP_URL`` into ``write_env``
    (None: nowhere); stop both on exit.

    ``api_key`` is what the tunnel's health check sends (default: the runner's key);
    ``on_event`` hears the tunnel's events after `Exposed` has recorded them. ``seams`` go to
    `Tunnel` unchanged (``command``, ``env``, ``resolve``).
    """
    config = config if config is not None else TunnelConfig()
    if config.binary is None and "command" not in seams:
        # Found now, before an app is imported and served: a missing binary costs milliseconds.
        config = dataclasses.replace(config, binary=find_cloudflared())
    if isinstance(origin, str):
        runner, config = None, config.for_origin(origin)
    else:
        runner = origin  # its URL is known once it serves

    with ExitStack() as stack:
        app_id = None
        if runner is not None:
            stack.enter_context(runner)
            config = config.for_origin(runner.url)
            app_id = runner.entry.app_id
            api_key = api_key or runner.settings.keys.primary
        assert config.origin_url is not None
        holder: list[Exposed] = []

        def record(event: TunnelEvent) -> None:
            if holder:
                holder[0]._record(event)
            if on_event is not None:
                on_event(event)

        tunnel = Tunnel(config, api_key=api_key, on_event=record, **seams)
        exposed = Exposed(tunnel, config.origin_url, app_id, _runner=runner)
        holder.append(exposed)
        stack.enter_context(tunnel)
        if config.mode == "quick":
            exposed.warnings.append(
                f"quick tunnels allow about {QUICK_TUNNEL_INFLIGHT_LIMIT} requests in flight: "
                f"smoke/eval runners cap their concurrency at {QUICK_TUNNEL_CONCURRENCY_CAP} "
                "for trycloudflare.com URLs; set the trainer's concurrency likewise")
        else:
            exposed.warnings.append(
                f"named tunnel: {config.hostname}'s service in the Cloudflare dashboard must be "
                f"{exposed.local_url}")
        if write_env:
            exposed.env_file = write_env_var(write_env, TASK_APP_URL, exposed.url)
        yield exposed


__all__ = ["Exposed", "expose"]
