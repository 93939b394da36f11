"""CLI: `tunnel` — serve a task app and make it public through cloudflared.

Signal handling lives here, not in the library: SIGTERM and SIGHUP unwind like Ctrl+C, so the
`expose()` block stops cloudflared and the local server before the process exits.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Annotated, Any

import typer

from synth_deploy.cli._common import (
    EnvFilesOption,
    HeadAfterOption,
    HeartbeatOption,
    JsonOption,
    MaxRolloutsOption,
    NoTraceOption,
    TraceDbOption,
    console,
    escape,
    handling_errors,
    resolve_env,
    resolve_traces,
    traces_where,
    warn,
)
from synth_deploy.errors import TunnelError, UsageError

if TYPE_CHECKING:
    from synth_deploy.tunnel import Exposed, TunnelEvent


def register(app: typer.Typer) -> None:
    app.command("tunnel")(tunnel)


def tunnel(
    app_ref: Annotated[str | None, typer.Argument(
        metavar="APP", help="An app id or task app file to serve and expose.",
        show_default=False)] = None,
    url: Annotated[str | None, typer.Option(
        "--url", help="Expose a server that is already running, e.g. http://127.0.0.1:8001.",
        show_default=False)] = None,
    port: Annotated[int | None, typer.Option(
        "--port", help="Port to serve APP on (default: a free port; 8001 for named tunnels).",
        show_default=False)] = None,
    mode: Annotated[str, typer.Option(
        "--mode", help="quick (no account, random hostname) or named (your hostname).")
    ] = "quick",
    token: Annotated[str | None, typer.Option(
        "--token", help="Named tunnel token (default: $TUNNEL_TOKEN).", show_default=False)
    ] = None,
    hostname: Annotated[str | None, typer.Option(
        "--hostname", help="Named tunnel's public hostname, e.g. app.example.com.",
        show_default=False)] = None,
    env_file: EnvFilesOption = None,
    write_env: Annotated[str, typer.Option(
        "--write-env", help="Write TASK_APP_URL into this .env file ('' to skip).")
    ] = ".env",
    timeout: Annotated[float, typer.Option(
        "--timeout", help="Seconds to wait for the public URL to answer healthy.")] = 60.0,
    no_verify: Annotated[bool, typer.Option(
        "--no-verify", help="Do not wait for the public URL to answer (DNS-filtered networks)."
    )] = False,
    max_restarts: Annotated[int, typer.Option(
        "--max-restarts", help="Restarts in a row before giving up when cloudflared dies.")
    ] = 3,
    no_auth: Annotated[bool, typer.Option(
        "--no-auth", help="Serve APP without an API key (anyone with the URL may call it).")
    ] = False,
    trace_db: TraceDbOption = None,
    no_trace: NoTraceOption = False,
    max_rollouts: MaxRolloutsOption = None,
    head_after: HeadAfterOption = None,
    heartbeat: HeartbeatOption = None,
    json_output: JsonOption = False,
) -> None:
    """Expose a task app through a Cloudflare tunnel.

    Serves APP (or uses --url) and stays up until Ctrl+C.
    """
    with handling_errors(json_output):
        from synth_deploy.tunnel import TunnelConfig, expose, find_cloudflared

        _check_origin(app_ref, url, port)
        env = resolve_env(env_file)
        # The one config, checked as it is built: what the user typed (URL, mode, token,
        # hostname) is judged before this machine is (cloudflared); the binary is still found
        # before anything is served, so a missing one fails in milliseconds.
        config = TunnelConfig(
            origin_url=url, mode=mode, hostname=hostname,
            token=_tunnel_token(token, mode, env),
            verify=not no_verify, verify_timeout_s=timeout, max_restarts=max_restarts)
        api_key = _api_key(env, url)
        config = dataclasses.replace(config, binary=find_cloudflared(env.values))
        runner = None
        if app_ref is not None:  # with --url, the running server records its own traces
            runner = _local_runner(app_ref, env, config.mode, port=port, no_auth=no_auth,
                                   traces=resolve_traces(trace_db, no_trace, env),
                                   max_rollouts=max_rollouts, head_after=head_after,
                                   heartbeat=heartbeat)
        out = console(stderr=True)
        if not json_output:
            _print_opening(out, config.mode, app_ref or url, runner)
        try:
            origin = runner if runner is not None else config.origin_url
            with _signals_interrupt(), expose(origin, config, api_key=api_key,
                                              write_env=write_env or None) as exposed:
                _announce(exposed, json_output)
                _stay_up(exposed, json_output)
        except TunnelError as exc:
            if exc.logs and not json_output:
                _print_tunnel_logs(out, exc.logs)
            raise


def _check_origin(app_ref: str | None, url: str | None, port: int | None) -> None:
    """Exactly one origin: an app to serve here, or the URL of one already running."""
    if (app_ref is None) == (url is None):
        raise UsageError("name a task app to serve, or --url of a server already running",
                         hint="synth-deploy tunnel math   or   synth-deploy tunnel --url "
                              "http://127.0.0.1:8001")
    if url is not None and port is not None:
        raise UsageError("--port and --url both name the origin", hint="give one of them")


def _tunnel_token(token: str | None, mode: str, env: Any) -> str | None:
    """--token, else $TUNNEL_TOKEN for a named tunnel; a quick tunnel takes none."""
    from synth_deploy.tunnel import TUNNEL_TOKEN

    return token or (env.get(TUNNEL_TOKEN) if mode == "named" else None)


def _api_key(env: Any, url: str | None) -> str | None:
    """The key the public URL is checked with: a server already running needs one given."""
    from synth_deploy.env import ENVIRONMENT_API_KEY, missing_key_hint

    api_key = env.get(ENVIRONMENT_API_KEY)
    if url is not None and not api_key:
        raise UsageError(f"no {ENVIRONMENT_API_KEY} to check {url} through the tunnel with",
                         hint=missing_key_hint())
    return api_key


def _serve_port(port: int | None, mode: str) -> int:
    """The port asked for; else 8001 for a named tunnel, as --help says, else a free one."""
    if port is not None:
        return port
    return 8001 if mode == "named" else 0


def _local_runner(app_ref: str, env: Any, mode: str, *, port: int | None, no_auth: bool,
                  traces: Any, max_rollouts: int | None, head_after: float | None,
                  heartbeat: float | None) -> Any:
    """The local server for APP, imported here so `--help` leaves uvicorn unloaded."""
    from synth_deploy.serving import LocalRunner, ServeSettings

    if no_auth:
        warn("--no-auth: the tunnel's public URL answers anyone, with no key")
    return LocalRunner(ServeSettings.resolve(
        app_ref, env, key_rule="open" if no_auth else "required", traces=traces,
        max_rollouts=max_rollouts, head_after_s=head_after, heartbeat_s=heartbeat,
        port=_serve_port(port, mode)))


def _print_opening(out: Any, mode: str, origin: str | None, runner: Any) -> None:
    """Say what is being exposed and where its traces go, before the slow part starts."""
    out.print(f"opening a {mode} tunnel to {escape(origin)}…")
    if runner is not None:
        out.print(f"traces → {escape(traces_where(runner.settings.traces))}")


def _print_tunnel_logs(out: Any, logs: list[str]) -> None:
    """cloudflared's own last words usually name the cause better than our summary can."""
    out.print("[dim]cloudflared's last lines:[/dim]", markup=True)
    for line in logs[-8:]:
        out.print(f"  [dim]{escape(line)}[/dim]", markup=True, highlight=False)


@contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt, as Ctrl+C does, until the block ends."""
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    names = [n for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n)]
    previous = {name: signal.signal(getattr(signal, name), interrupt) for name in names}
    try:
        yield
    finally:
        for name, handler in previous.items():
            signal.signal(getattr(signal, name), handler)


def _emit_json(data: dict[str, Any]) -> None:
    # One object a line: this command runs for hours and reports as it goes.
    sys.stdout.write(json.dumps(data) + "\n")
    sys.stdout.flush()


def _announce(exposed: Exposed, json_output: bool) -> None:
    if json_output:
        _emit_json({"event": "ready", "ok": True, **exposed.to_dict()})
        return
    for message in exposed.warnings:
        warn(message)
    written = f"  (TASK_APP_URL written to {exposed.env_file})" if exposed.env_file else ""
    console().print(f"[green]public URL:[/green] [bold]{exposed.url}[/bold]{written}",
                    markup=True, highlight=False)
    console(stderr=True).print(f"local server {exposed.local_url} · Ctrl+C to stop")


def _stay_up(exposed: Exposed, json_output: bool) -> None:
    err = console(stderr=True)
    live_view = err.is_terminal and not json_output
    if live_view:
        from rich.live import Live

        view = Live(console=err, refresh_per_second=2, transient=True)
    else:
        view = nullcontext()
    shown, shown_at = "", 0.0
    with view:
        while True:
            for event in exposed.drain_events():
                _render_event(event, json_output)
            if exposed.error is not None:
                raise exposed.error
            line = _status_line(exposed.url, exposed.stats())
            if live_view:
                view.update(line)
            elif not json_output and line != shown and time.monotonic() - shown_at >= 10:
                err.print(line, highlight=False)
                shown, shown_at = line, time.monotonic()
            time.sleep(0.5)


def _render_event(event: TunnelEvent, json_output: bool) -> None:
    if event.kind == "ready":  # announced already
        return
    if json_output:
        _emit_json({"event": event.kind, "url": event.url, "message": event.message})
    elif event.kind == "restarted":
        console().print(f"[green]public URL:[/green] [bold]{event.url}[/bold]  (restarted; "
                        "TASK_APP_URL updated)", markup=True, highlight=False)
    elif event.kind in ("died", "restarting"):
        warn(event.message)


def _status_line(url: str, stats: dict[str, float]) -> str:
    up = int(stats["uptime_s"])
    uptime = f"{up // 3600}h{up % 3600 // 60:02d}m" if up >= 3600 else f"{up // 60}m{up % 60:02d}s"
    restarts = f" · {int(stats['restarts'])} restarts" if stats["restarts"] else ""
    return (f"{url} · {int(stats['requests'])} requests · {int(stats['rollouts'])} rollouts · "
            f"{int(stats['errors'])} errors · {int(stats['in_flight'])} in flight · "
            f"up {uptime}{restarts}")
