"""CLI: `serve`, `apps`, `setup`, `smoke` — working with task apps on this machine."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from synth_deploy.cli._common import (
    EXIT_FAILURE,
    Column,
    EnvFilesOption,
    HeadAfterOption,
    HeartbeatOption,
    JsonOption,
    MaxRolloutsOption,
    NoTraceOption,
    TraceDbOption,
    console,
    escape,
    fitted_table,
    handling_errors,
    print_json,
    resolve_env,
    resolve_traces,
    traces_where,
    warn,
)

AppArg = Annotated[str, typer.Argument(metavar="APP",
                                       help="An app id (see `synth-deploy apps`) or a path "
                                            "to a task app file.", show_default=False)]
NoAuthOption = Annotated[bool, typer.Option(
    "--no-auth", help="Serve without an API key: anyone who reaches the port may call it.")]


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
    app.command("apps")(apps)
    app.command("setup")(setup)
    app.command("init")(init)


def serve(
    app_ref: AppArg,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.", min=1, max=65535)] = 8001,
    reload: Annotated[bool, typer.Option("--reload", help="Restart when files change.")] = False,
    no_auth: NoAuthOption = False,
    env_file: EnvFilesOption = None,
    trace_db: TraceDbOption = None,
    no_trace: NoTraceOption = False,
    max_rollouts: MaxRolloutsOption = None,
    head_after: HeadAfterOption = None,
    heartbeat: HeartbeatOption = None,
    access_log: Annotated[bool, typer.Option(
        "--access-log", help="A log line per request (default: a summary line every "
                             "10 s while rollouts run).")] = False,
) -> None:
    """Serve a task app locally.

    uvicorn on HOST:PORT; SIGTERM drains in-flight rollouts before exiting.
    """
    with handling_errors():
        from synth_deploy.serving import (
            DEFAULT_SUMMARY_EVERY_S,
            LocalRunner,
            ServeSettings,
        )

        env = resolve_env(env_file)
        traces = resolve_traces(trace_db, no_trace, env)
        runner = LocalRunner(ServeSettings.resolve(
            app_ref, env, key_rule="open" if no_auth else "required", traces=traces,
            max_rollouts=max_rollouts, head_after_s=head_after, heartbeat_s=heartbeat,
            host=host, port=port, env_files=tuple(str(p) for p in env_file or ()),
            access_log=access_log,
            summary_every_s=None if access_log else DEFAULT_SUMMARY_EVERY_S))
        keys = runner.settings.keys
        app_id = runner.entry.app_id

        def announce() -> None:  # once the port is bound: a banner never precedes a failure
            if no_auth:
                warn("--no-auth: every endpoint answers anyone who can reach "
                     f"{host}:{port}; never expose this server")
            console(stderr=True).print(
                f"serving [bold]{escape(app_id)}[/bold] at http://{host}:{port}  "
                f"key {escape(keys.describe())}  traces → {escape(traces_where(traces))}  "
                f"max {runner.settings.rollouts.max_in_flight} rollouts at once")
            if runner.serves_openenv:  # OpenEnv's clients take this base URL, not the root
                console(stderr=True).print(f"OpenEnv clients: base URL http://{host}:{port}"
                                           "/openenv", highlight=False)

        if reload:
            announce()
            runner.serve_with_reload()
        else:
            runner.serve_forever(on_ready=announce)


def init(name: Annotated[str, typer.Argument(metavar="NAME",
                                             help="The new app's id and folder.")]) -> None:
    """Start a new task app: NAME/task_app.py (an environment), NAME/rl.toml (a training
    run, each field explained) and NAME/README.md (the next commands)."""
    with handling_errors():
        from synth_deploy.taskapp.scaffold import scaffold_app

        for file in scaffold_app(name):
            console().print(f"wrote {escape(str(file))}")
        console().print(f"next: synth-deploy smoke {escape(name)}")


def apps(json_output: JsonOption = False) -> None:
    """List the task apps found here.

    Looks under ./apps, the folders `init` makes here (./NAME/task_app.py) and the kit's
    bundled examples, without importing them. Files that
    cannot be read (a syntax error...) are listed with file:line (on stderr, or under
    "problems" with --json), and exit 1.
    """
    from synth_deploy.taskapp.registry import scan_apps

    found = scan_apps()
    if json_output:
        print_json({"apps": [a.to_dict() for a in found.apps],
                    "problems": [p.to_dict() for p in found.problems]})
        if found.problems:
            raise typer.Exit(EXIT_FAILURE)
        return
    if not found.apps:
        console().print("no task apps found under ./apps or ./*/task_app.py")
    else:
        rows = [[escape(a.app_id), escape(a.description), escape(a.path)] for a in found.apps]
        console().print(fitted_table(
            [Column("id"), Column("description", wrap=True, min_width=20),
             Column("file", wrap=True, min_width=20)], rows, width=console().width))
    if found.problems:
        err = console(stderr=True)
        err.print(f"[red]{len(found.problems)} app file(s) could not be read[/red] (the apps "
                  "they declare are missing above):")
        for problem in found.problems:
            err.print(f"  {escape(problem)}", soft_wrap=True, highlight=False)
        raise typer.Exit(EXIT_FAILURE)


def setup(
    env_file: Annotated[Path, typer.Option("--env-file", help="The .env file to write.")] = Path(
        ".env"),
    force: Annotated[bool, typer.Option("--force", help="Replace an existing key.")] = False,
    json_output: JsonOption = False,
) -> None:
    """Mint ENVIRONMENT_API_KEY into .env.

    Every other line of the file is kept; the key is shown masked.
    """
    with handling_errors(json_output):
        from synth_deploy.env import (
            ENVIRONMENT_API_KEY,
            mask,
            mint_key,
            parse_env_file,
            write_env_var,
        )

        existing = parse_env_file(env_file).get(ENVIRONMENT_API_KEY) if env_file.exists() else None
        if existing and not force:
            key, action = existing, "kept"
        else:
            key, action = mint_key(), ("replaced" if existing else "created")
            write_env_var(env_file, ENVIRONMENT_API_KEY, key)
        if json_output:
            print_json({"ok": True, "env_file": str(env_file), "action": action,
                        "key": mask(key)})
            return
        console().print(f"{ENVIRONMENT_API_KEY} {action} in {env_file}: {mask(key)}")
        if action == "kept":
            console().print("  (pass --force to mint a new one)")
