"""CLI: `deploy` (a task app to Modal, verified healthy) and `modal-serve` (Modal's dev mode)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Any

import typer

from synth_deploy.cli._common import (
    Column,
    EnvFilesOption,
    JsonOption,
    console,
    escape,
    fitted_table,
    handling_errors,
    print_json,
    resolve_env,
    warn,
)

NameOption = Annotated[str | None, typer.Option("--name", help="Modal app name "
                                                "(default: the app's ModalSettings, or "
                                                "synth-<app id>).", show_default=False)]
ModalEnvOption = Annotated[str | None, typer.Option("--modal-env", help="Modal environment "
                                                    "(default: MODAL_ENVIRONMENT or your "
                                                    "profile's).", show_default=False)]
# A seam for tests and unusual installs: the command that runs Modal's CLI.
ModalCLIOption = Annotated[str | None, typer.Option("--modal-cli", hidden=True)]


def _env_files(env_file: list[Path] | None) -> tuple[Path, ...]:
    # Absolute: the `modal` child is told these files and must find the same ones.
    return tuple(p.resolve() for p in env_file or ())


def _cli(command: str | None) -> Any:
    from synth_deploy.modal import ModalCLI

    return ModalCLI(shlex.split(command)) if command else None


def _render_plan(plan: Any) -> None:
    out = console()
    out.soft_wrap = True  # a plan line is a unit; let the terminal wrap it
    d = plan.to_dict()
    out.print(f"[bold]Deploy plan[/bold]: {escape(d['app_id'])} -> Modal app "
              f"[bold]{escape(d['modal_app'])}[/bold] ({escape(d['source'])})")
    out.print(f"  expected URL  {d['expected_url']}", markup=False)
    out.print(f"  environment   {d['modal_environment'] or '(your default)'}", markup=False)
    if d.get("identity"):
        code = d["identity"]
        out.print(f"  code          version {code['version'] or '-'}, digest {code['digest']} "
                  f"({len(code['files'])} file(s): {', '.join(code['files'])})", markup=False)
    out.print("[bold]Image[/bold]")
    for step in d["image"]["steps"]:
        out.print(f"  {step}", markup=False)
    out.print(f"  {d['image']['dependency_count']} Python distributions in the image: "
              f"{', '.join(d['image']['dependencies'])}", markup=False)
    _render_secrets(out, d["secrets"])
    if d["env"]:
        out.print("[bold]Env[/bold]")
        for key, value in d["env"].items():
            out.print(f"  {key}={value}", markup=False)
    out.print(_resources_line(d["resources"]))
    out.print(f"[bold]Tracing[/bold]  {escape(d['tracing'])}")
    if (box := d["sandbox"]) is not None:
        out.print(_sandbox_line(box))
    for message in d["warnings"]:
        warn(message)


def _render_secrets(out: Any, secrets: list[dict[str, Any]]) -> None:
    """Each Modal Secret: a stored one by name, one made here with each key and its source."""
    out.print("[bold]Secrets[/bold] (Modal Secrets, not in the image)")
    for secret in secrets:
        if secret["kind"] == "name":
            out.print(f"  {secret['name']} (Secret.from_name, stored in Modal)", markup=False)
            continue
        out.print(f"  {secret['name']} (Secret.from_dict)", markup=False)
        for key, info in secret["keys"].items():
            out.print(f"    {key} = {info['value']}  from {info['from']}", markup=False)


def _resources_line(res: dict[str, Any]) -> str:
    """The container's resources in one line, Modal's defaults said as such."""
    containers = f"{res['min_containers']}..{res['max_containers'] or 'auto'}"
    memory = f"{res['memory_mib']} MiB" if res["memory_mib"] else "Modal's default"
    cpu = res["cpu"] or "Modal's default"
    return (f"[bold]Resources[/bold]  timeout {res['timeout_s']}s · memory {memory} · "
            f"cpu {cpu} · containers {containers} · {res['concurrent_inputs']} concurrent "
            f"inputs/container" + (f" · volumes {res['volumes']}" if res["volumes"] else ""))


def _sandbox_line(box: dict[str, Any]) -> str:
    """The app's sandboxes in one line: where, image and packages, limits, network."""
    return (f"[bold]Sandboxes[/bold]  modal.Sandbox in app {escape(box['modal_app'])} · "
            f"image {escape(box['image'] or 'debian_slim')}"
            + (f" + {escape(' '.join(box['packages']))}" if box["packages"] else "")
            + f" · cpu {box['cpu']} · memory {box['memory_mb']} MiB · life "
            f"{box['timeout_s']:g}s · command {box['command_timeout_s']:g}s · files ≤ "
            f"{box['max_file_mb']} MiB · network {escape(box['network'])}")


def _progress():
    err = console(stderr=True)
    err.soft_wrap = True

    def show(stage: str, message: str) -> None:
        if stage == "modal":
            err.print(f"  [dim]modal |[/dim] {escape(message)}", markup=True, highlight=False)
        else:
            err.print(f"[cyan]{stage:>8}[/cyan] {escape(message)}", markup=True,
                      highlight=False)

    return show


def logs(
    app_ref: Annotated[str, typer.Argument(metavar="APP", help="App id or task app file (its "
                                           "Modal app, as deployed), or a Modal app name.")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Stream until Ctrl+C.")] = False,
    tail: Annotated[int | None, typer.Option(min=1, help="The last N lines (Modal's "
                                             "default: 100).", show_default=False)] = None,
    env_file: EnvFilesOption = None,
    modal_env: ModalEnvOption = None,
    modal_cli: ModalCLIOption = None,
) -> None:
    """A deployed app's logs, from Modal (`modal app logs`), the app's keys masked."""
    with handling_errors():
        from synth_deploy.modal import app_logs

        env = resolve_env(env_file)
        app_logs(app_ref, env, follow=follow, tail=tail, modal_environment=modal_env,
                 cli=_cli(modal_cli), on_line=lambda line: print(line, flush=True))


def deployed(
    every: Annotated[bool, typer.Option("--all", help="Every app in the Modal environment, "
                                        "not only those named as deploy names them "
                                        "(synth-<app id>).")] = False,
    env_file: EnvFilesOption = None,
    modal_env: ModalEnvOption = None,
    json_output: JsonOption = False,
    modal_cli: ModalCLIOption = None,
) -> None:
    """The task apps deployed to Modal (`modal app list`): state, running containers."""
    with handling_errors(json_output):
        from synth_deploy.modal import deployed_apps

        apps = deployed_apps(resolve_env(env_file), modal_environment=modal_env, every=every,
                             cli=_cli(modal_cli))
    if json_output:
        print_json({"apps": [a.to_dict() for a in apps]})
        return
    if not apps:
        console().print("no deployed apps named synth-<app id> (--all: every app)"
                        if not every else "no apps in this Modal environment")
        return
    rows = [[escape(a.name), escape(a.state), str(a.containers), escape(a.created_at or "-"),
             escape(a.stopped_at or "-"), escape(a.modal_app_id)] for a in apps]
    out = console()
    out.print(fitted_table([Column("app"), Column("state"), Column("containers", justify="right"),
                            Column("created"), Column("stopped", optional=True),
                            Column("modal app id", optional=True)], rows, width=out.width))


def stop(
    app_ref: Annotated[str, typer.Argument(metavar="APP", help="App id or task app file (its "
                                           "Modal app, as deployed), or a Modal app name.")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Stop without asking (needed "
                                      "without a terminal).")] = False,
    env_file: EnvFilesOption = None,
    modal_env: ModalEnvOption = None,
    json_output: JsonOption = False,
    modal_cli: ModalCLIOption = None,
) -> None:
    """Stop a deployed app (`modal app stop`): its containers end at once, rollouts in flight
    are cut; its trace Volume is kept."""
    with handling_errors(json_output):
        import sys

        from synth_deploy.errors import UsageError
        from synth_deploy.modal import stop_app

        def confirm(found, consequences) -> None:
            if yes:
                return
            if json_output or not sys.stdin.isatty():
                raise UsageError(f"stopping {found.name} ends its {found.containers} running "
                                 "container(s) and the rollouts in them: nothing was stopped",
                                 hint="pass --yes to stop it")
            err = console(stderr=True)
            err.print(f"Stopping [bold]{escape(found.name)}[/bold]:")
            for line in consequences:
                err.print(f"  - {escape(line)}", soft_wrap=True, highlight=False)
            typer.confirm("Stop it?", abort=True)

        result = stop_app(app_ref, resolve_env(env_file), modal_environment=modal_env,
                          cli=_cli(modal_cli), confirm=confirm)
    if json_output:
        print_json(result.to_dict())
        return
    out = console()
    if result.already_stopped:
        out.print(f"{escape(result.name)} was already stopped", highlight=False)
        return
    out.print(f"[green]stopped[/green] {escape(result.name)} ({escape(result.modal_app_id)})",
              highlight=False)
    for line in result.consequences:
        out.print(f"  - {escape(line)}", soft_wrap=True, highlight=False)


def register(app: typer.Typer) -> None:
    app.command("logs")(logs)
    app.command("deployed")(deployed)
    app.command("stop")(stop)
    @app.command("deploy")
    def deploy_command(
        app_ref: Annotated[str, typer.Argument(metavar="APP", help="App id or task app file.")],
        name: NameOption = None,
        env_file: EnvFilesOption = None,
        modal_env: ModalEnvOption = None,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan (image, "
                                              "secrets masked, resources, URL); send "
                                              "nothing.")] = False,
        no_check: Annotated[bool, typer.Option("--no-check", help="Skip the local and "
                                               "post-deploy health checks.")] = False,
        timeout: Annotated[float, typer.Option("--timeout", help="Seconds allowed for "
                                               "Modal's deploy step.")] = 600.0,
        check_timeout: Annotated[float, typer.Option("--check-timeout", help="Seconds to "
                                                     "wait for the deployed app to be "
                                                     "healthy (cold start included).")] = 300.0,
        json_output: JsonOption = False,
        modal_cli: ModalCLIOption = None,
    ) -> None:
        """Deploy a task app to Modal, verified healthy.

        Validates locally, deploys, checks the URL, writes TASK_APP_URL.
        """
        with handling_errors(json_output):
            from synth_deploy.modal import DeployOptions, deploy

            files = _env_files(env_file)
            options = DeployOptions(name=name, modal_environment=modal_env, env_files=files,
                                    check=not no_check, dry_run=dry_run,
                                    deploy_timeout_s=timeout, health_timeout_s=check_timeout)
            result = deploy(app_ref, resolve_env(list(files)), options, cli=_cli(modal_cli),
                            on_progress=_progress())
        if json_output:
            print_json(result.to_dict())
        elif result.dry_run:
            _render_plan(result.plan)
        else:
            checked = " (healthy)" if result.remote_report is not None else " (not checked)"
            console().print(f"[green]deployed[/green] {result.plan.app_id} -> {result.url}"
                            f"{checked}; TASK_APP_URL written to {result.env_file}",
                            markup=True, highlight=False)
            console().print(escape(result.plan.tracing), markup=True, highlight=False)

    @app.command("modal-serve")
    def modal_serve_command(
        app_ref: Annotated[str, typer.Argument(metavar="APP", help="App id or task app file.")],
        env_file: EnvFilesOption = None,
        modal_env: ModalEnvOption = None,
        json_output: Annotated[bool, typer.Option(
            "--json", help="NDJSON for machines: one event a line (modal's output lines, "
                           "ready with the URL, exit).")] = False,
        modal_cli: ModalCLIOption = None,
    ) -> None:
        """Run a task app in Modal's dev mode.

        `modal serve`: hot reload, a -dev URL.
        """
        with handling_errors(json_output):
            from synth_deploy.modal import serve_dev

            files = _env_files(env_file)
            code = serve_dev(app_ref, resolve_env(list(files)), env_files=files,
                             modal_environment=modal_env, cli=_cli(modal_cli),
                             on_line=_ndjson_events() if json_output else None)
        if json_output:
            print_json({"event": "exit", "ok": code == 0, "exit_code": code}, one_line=True)
        raise typer.Exit(code)


def _ndjson_events():
    """`modal serve`'s lines as NDJSON events, plus one "ready" event when its URL appears."""
    from collections import deque

    from synth_deploy.modal import find_web_url

    recent: deque[str] = deque(maxlen=3)  # modal prints the URL up to 2 lines after its label
    announced = False

    def on_line(line: str) -> None:
        nonlocal announced
        print_json({"event": "modal", "line": line}, one_line=True)
        if announced:
            return
        recent.append(line)
        url = find_web_url(recent)
        if url is not None:
            print_json({"event": "ready", "url": url}, one_line=True)
            announced = True

    return on_line
