"""A stand-in for Modal's `modal` CLI (`modal deploy|serve FILE [--name N] [-e ENV]`, `modal app
logs|list|stop`, `modal volume ls|get`), for tests.

It does what the real one does up to the network: checks for a token, connects to the API
server named by MODAL_SERVER_URL (when set) and, like Modal's client, keeps retrying in
silence while it cannot (tests point it at tests/standins/modal_api.py), imports the file with
Modal's own import code (``modal.cli.import_refs``), finds the App's web function — and then,
instead of uploading, it "runs the container" locally: every file the image mounts is copied
into a temporary root, and a child process with only that root on its path, and only the
function's secrets and env as its environment, serves the web function on 127.0.0.1. It
prints Modal 1.6's deploy output with that URL and exits, leaving the "container" running
(its pid is written to ``$STANDIN_MODAL_STATE_DIR/pids``; the test stops it).

``STANDIN_MODAL_MODE``: ok (default) · hang (never answers; `modal app` too) · no-url (success
output without a web URL) · fail (crashes, printing the app's API key as a careless tool
might).
``STANDIN_MODAL_SECRETS`` (JSON {name: {VAR: value}}) plays the named secrets stored in Modal.
``STANDIN_MODAL_CONTAINERS`` (default 1): how many containers each web function starts; each
is a line of ``$STANDIN_MODAL_STATE_DIR/containers.jsonl`` ({pid, url, task_id, app}); the first
one's URL is printed. The function's Volumes are played by modal_volume.py: each container
"mounts" its own view at ROOT/<mount path> (a variable of the function's env that names a
path under a mount is pointed there, as the stand-in cannot use the absolute path), and
`modal volume ls VOLUME [PATH] --json` / `modal volume get VOLUME REMOTE LOCAL [--force]` (a
file, or a folder's files under the folder's name) read the committed state, as Modal's do.
Each call's arguments are a line of ``$STANDIN_MODAL_STATE_DIR/calls.jsonl``. A file's
`get` takes ``STANDIN_MODAL_GET_S`` seconds (default 0: a connection's round trips) and
is a line of ``gets.jsonl`` there ({remote, start, end}, wall-clock seconds).
`modal serve` prints the same and then stays in the foreground until SIGINT/SIGTERM.

A deploy is recorded in ``$STANDIN_MODAL_STATE_DIR/apps.json`` ({name: {app_id, env,
created_at, stopped_at}}), as Modal keeps its deployed apps. `modal app list --json [-e ENV]`
prints them as Modal 1.6 does (a JSON array of {app_id, description, state, tasks,
created_at, stopped_at}: description is the app's name, tasks its running containers as a
string, times local ISO with a space). `modal app stop NAME [-y] [-e ENV]` does what Modal's
does: an unknown name is its NotFoundError, a stopped app "App is already stopped.", no
``-y`` without a terminal is refused; with ``-y`` the app's containers are killed at once
(SIGKILL: Modal "immediately terminates" them, no drain) and the app is stopped. Its Volumes
are left as they are: a Volume is not the app's.

Modal's Dicts (the containers' shared rollout records) are one modal_dict.py service per
state dir, started with the first container.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import modal_inspect  # noqa: E402
import modal_volume  # noqa: E402

from synth_deploy.modal import dependency_closure  # noqa: E402


def _out(line: str = "") -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _token_missing() -> int:
    # What modal 1.6.4 prints (to a pipe) when it finds no credentials.
    _out("Error: Token missing. Could not authenticate client. If you have token credentials, "
         "see modal.com/docs/sdk/py/latest/config for setup help. If you are a new user, "
         "register an account at modal.com, then run `modal token new`.")
    return 1


def _connect_to_api() -> None:
    """Wait until the API server accepts a connection, retrying without a word (as Modal's
    client does for minutes when the network is gone)."""
    url = os.environ.get("MODAL_SERVER_URL")
    if not url:
        return
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    address = (parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
    parent = os.getppid()
    while True:
        try:
            socket.create_connection(address, timeout=5).close()
            return
        except OSError:
            if os.getppid() != parent:  # a test gave up on us: do not retry forever
                sys.exit(1)
            time.sleep(1)


def deploy(args: argparse.Namespace) -> int:
    mode = os.environ.get("STANDIN_MODAL_MODE", "ok")
    if not (os.environ.get("MODAL_TOKEN_ID") and os.environ.get("MODAL_TOKEN_SECRET")):
        return _token_missing()
    _connect_to_api()
    if mode == "hang":
        _out("Connecting to Modal...")
        time.sleep(3600)
        return 1
    from modal.cli.import_refs import import_app_from_ref, parse_import_ref

    started = time.monotonic()
    app = import_app_from_ref(parse_import_ref(args.file), base_cmd="modal deploy")
    name = args.name or app.name
    functions = modal_inspect.web_functions(app)
    if mode == "fail":
        spec = modal_inspect.function_spec(next(iter(functions.values())))
        values = {k: v for s in spec.secrets
                  for k, v in (modal_inspect.secret_env(s) or {}).items()}
        _out("Traceback (most recent call last):")
        _out(f"modal.exception.InvalidError: bad environment {values}")
        return 1
    _out("✓ Initialized. View run at https://modal.com/apps/standin/main/ap-standin")
    _out("✓ Created objects.")
    _out(f"├── 🔨 Created mount {Path(args.file).resolve().parent}")
    _out("├── 🔨 Created mount PythonPackage:synth_deploy")
    if mode != "no-url":
        for fn_name, fn in functions.items():
            count = int(os.environ.get("STANDIN_MODAL_CONTAINERS", "1"))
            url = [_start_container(fn, name, i) for i in range(count)][0]
            _out(f"└── ✓ Created web function {fn_name}")
            _out(f"    └── {url} (unauthenticated)")
    else:
        for fn_name in functions:
            _out(f"└── 🔨 Created function {fn_name}.")
    if args.command == "serve":
        return _serve_until_signalled()
    _record_app(name, args.env)
    _out(f"✓ App deployed in {time.monotonic() - started:.3f}s! 🎉")
    _out("")
    env = f"/{args.env}" if args.env else "/main"
    _out(f"View Deployment: https://modal.com/apps/standin{env}/deployed/{name}")
    return 0


def _serve_until_signalled() -> int:
    _out("⚡️ Serving... hit Ctrl-C to stop!")
    stop = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.append(True))
    while not stop:
        time.sleep(0.1)
    _out("Stopping app - local entrypoint completed.")
    return 0


def _mount_volumes(spec, root: Path, state: Path, env: dict[str, str]) -> dict[str, list[str]]:
    """Each Volume's committed state copied into this container's view at ROOT/<mount>."""
    views = {}
    for mount, volume in spec.volumes.items():
        name = modal_inspect.volume_name(volume)
        store = modal_volume.committed_dir(state, name)
        store.mkdir(parents=True, exist_ok=True)  # create_if_missing
        view = root / str(mount).lstrip("/")
        shutil.copytree(store, view, dirs_exist_ok=True)
        views[name] = [str(store), str(view)]
        for key, value in env.items():
            if value == str(mount) or value.startswith(f"{mount}/"):
                env[key] = str(root) + value
    return views


def dict_service(state: Path) -> str:
    """The URL of the Dict service of this stand-in Modal (modal_dict.py, one process for
    every container, started once; its pid in ``pids``). ``STANDIN_MODAL_DICT_IDLE_S``: how
    long an entry lives unused (Modal: 7 days)."""
    port_file = state / "dict.port"
    if not port_file.exists():
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "modal_dict.py"), str(port_file),
             os.environ.get("STANDIN_MODAL_DICT_IDLE_S", "604800")],
            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(state / "pids", "a") as fh:
            fh.write(f"{proc.pid}\n")
        deadline = time.monotonic() + 15
        while not port_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the Dict service did not start")
            time.sleep(0.02)
    return f"http://127.0.0.1:{port_file.read_text().strip()}"


def _start_container(function, app_name: str, index: int = 0) -> str:
    state = Path(os.environ["STANDIN_MODAL_STATE_DIR"])
    spec = modal_inspect.function_spec(function)
    root = state / f"container-{app_name}-{time.monotonic_ns()}"
    modal_inspect.materialize(spec.image, root)
    stored = json.loads(os.environ.get("STANDIN_MODAL_SECRETS", "{}"))
    task_id = f"ta-standin{index}-{time.monotonic_ns() % 10**9}"
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(root / "root"),
           "MODAL_TASK_ID": task_id}
    for secret in spec.secrets:
        values = modal_inspect.secret_env(secret)
        if values is None:
            name = modal_inspect.secret_name(secret)
            if name not in stored:
                raise SystemExit(f"Secret '{name}' not found in environment 'main'")
            values = stored[name]
        env.update(values)
    env["STANDIN_MODAL_VOLUMES"] = json.dumps(_mount_volumes(spec, root, state, env))
    env["STANDIN_VOLUME_BACKGROUND_S"] = os.environ.get("STANDIN_VOLUME_BACKGROUND_S", "5")
    env["STANDIN_MODAL_SANDBOXES"] = str(state / "sandboxes")  # modal_sandbox.py's state
    env["STANDIN_MODAL_DICT_URL"] = dict_service(state)
    raw = modal_inspect._raw(function)
    info = raw._get_source_info()
    port_file = root / "port"
    # What the container may import from site-packages: the image's pip layer, plus the
    # server runtime that plays Modal's (uvicorn).
    allowed = dependency_closure(modal_inspect.pip_requirements(spec.image) + ["uvicorn"])
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "modal_container.py"), str(root / "root"),
         info.module_name, info.implementation_name, str(port_file), json.dumps(allowed)],
        env=env, cwd=root / "root", start_new_session=True,
        stdout=open(root / "container.log", "w"), stderr=subprocess.STDOUT)
    with open(state / "pids", "a") as fh:
        fh.write(f"{proc.pid}\n")
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            log = (root / "container.log").read_text()
            raise SystemExit(f"container failed to start:\n{log}")
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port_file.read_text().strip()}"
    with open(state / "containers.jsonl", "a") as fh:
        fh.write(json.dumps({"pid": proc.pid, "url": url, "task_id": task_id,
                             "app": app_name}) + "\n")
    return url


def volume(args: argparse.Namespace) -> int:
    """`modal volume ls|get`: the committed state only, as a laptop sees it."""
    if not (os.environ.get("MODAL_TOKEN_ID") and os.environ.get("MODAL_TOKEN_SECRET")):
        return _token_missing()
    _connect_to_api()
    store = modal_volume.committed_dir(Path(os.environ["STANDIN_MODAL_STATE_DIR"]), args.name)
    if not store.is_dir():
        _out(f"Error: Volume '{args.name}' not found in environment 'main'")
        return 1
    if args.action == "ls":
        folder = store / args.path.strip("/")
        if not folder.is_dir():
            _out(f"Error: No such file or directory: {args.path}")
            return 1
        rows = []
        for entry in sorted(folder.iterdir()):
            if entry.name.startswith("."):
                continue  # an upload in progress is not in the listing
            st = entry.stat()
            rows.append({"filename": entry.relative_to(store).as_posix(),
                         "type": "dir" if entry.is_dir() else "file",
                         "created_modified": datetime.fromtimestamp(st.st_mtime).astimezone()
                         .isoformat(sep=" ", timespec="seconds"),
                         "size": st.st_size})
        _out(json.dumps(rows, indent=2))
        return 0
    source = store / args.remote.strip("/")
    if source.is_dir():  # as Modal's: every committed file, under the folder's own name
        dest = Path(args.local)
        for entry in sorted(source.rglob("*")):
            if entry.is_file() and not entry.name.startswith("."):
                target = dest / entry.relative_to(source.parent)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(entry, target)
        _out("✓ Finished downloading files to local!")
        return 0
    if not source.is_file():
        _out(f"Error: No such file or directory: {args.remote}")
        return 1
    dest = Path(args.local)
    if dest.is_dir():
        dest = dest / source.name
    if dest.exists() and not args.force:
        _out(f"Error: Output path '{dest}' already exists. Use --force to overwrite.")
        return 1
    start = time.time()
    time.sleep(float(os.environ.get("STANDIN_MODAL_GET_S") or 0))
    shutil.copyfile(source, dest)
    with open(Path(os.environ["STANDIN_MODAL_STATE_DIR"]) / "gets.jsonl", "a") as fh:
        fh.write(json.dumps({"remote": args.remote, "start": start, "end": time.time()}) + "\n")
    _out("✓ Finished downloading files to local!")
    return 0


def app_logs(args: argparse.Namespace) -> int:
    """`modal app logs NAME [-f] [--tail N] [-e ENV]`: the "container"'s output, as Modal
    keeps a deployed app's; an app never deployed is Modal's NotFoundError."""
    state = Path(os.environ["STANDIN_MODAL_STATE_DIR"])
    logs = sorted(state.glob(f"container-{args.name}-*/container.log"))
    if not logs:
        env = args.env or "main"
        _out(f"Error: No App with name '{args.name}' found in the '{env}' environment.")
        return 1
    lines = logs[-1].read_text().splitlines()
    for line in lines[-(args.tail or 100):]:
        _out(line)
    return _serve_until_signalled() if args.follow else 0


def _apps_file() -> Path:
    return Path(os.environ["STANDIN_MODAL_STATE_DIR"]) / "apps.json"


def _apps() -> dict:
    path = _apps_file()
    return json.loads(path.read_text()) if path.exists() else {}


def _record_app(name: str, env: str | None) -> None:
    apps = _apps()
    apps[name] = {"app_id": "ap-" + os.urandom(11).hex()[:22], "env": env or "main",
                  "created_at": time.time(), "stopped_at": None}
    _apps_file().write_text(json.dumps(apps))


def _running_containers(name: str) -> list[int]:
    path = Path(os.environ["STANDIN_MODAL_STATE_DIR"]) / "containers.jsonl"
    pids = []
    for line in path.read_text().splitlines() if path.exists() else ():
        container = json.loads(line)
        if container.get("app") != name:
            continue
        try:
            os.kill(container["pid"], 0)
        except ProcessLookupError:
            continue
        pids.append(container["pid"])
    return pids


def _when(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts).astimezone().isoformat(sep=" ", timespec="seconds") \
        if ts else None


def app_list(args: argparse.Namespace) -> int:
    rows = []
    for name, app in _apps().items():
        if app["env"] != (args.env or "main"):
            continue
        rows.append({"app_id": app["app_id"], "description": name,
                     "state": "stopped" if app["stopped_at"] else "deployed",
                     "tasks": str(len(_running_containers(name))),
                     "created_at": _when(app["created_at"]),
                     "stopped_at": _when(app["stopped_at"])})
    if args.json:
        _out(json.dumps(rows, indent=2))  # rich's print_json: indented
    else:
        for row in rows:
            _out(f"{row['app_id']}  {row['description']}  {row['state']}  {row['tasks']}")
    return 0


def app_stop(args: argparse.Namespace) -> int:
    apps, env = _apps(), args.env or "main"
    app = apps.get(args.name)
    if app is None or app["env"] != env:
        _out(f"Error: No App with name '{args.name}' found in the '{env}' environment.")
        return 1
    if app["stopped_at"]:
        sys.stderr.write(f"App is already stopped. (Stopped at {_when(app['stopped_at'])} by "
                         "'standin').\n")
        return 1
    pids = _running_containers(args.name)
    if not args.yes:
        _out(f"Are you sure you want to stop App '{args.name}' in the '{env}' environment? "
             f"This will immediately terminate {len(pids)} running "
             f"container{'s' if len(pids) != 1 else ''}. [y/N]: ")
        sys.stderr.write("Aborted: no interactive terminal detected. Rerun with --yes (-y) to "
                         "skip confirmation.\n")
        return 1
    for pid in pids:
        os.killpg(pid, signal.SIGKILL)  # each container leads its own session
    app["stopped_at"] = time.time()
    _apps_file().write_text(json.dumps(apps))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="modal")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in ("deploy", "serve"):
        d = sub.add_parser(command)
        d.add_argument("file")
        d.add_argument("--name")
        d.add_argument("-e", "--env")
    vol = sub.add_parser("volume").add_subparsers(dest="action", required=True)
    ls = vol.add_parser("ls")
    ls.add_argument("name")
    ls.add_argument("path", nargs="?", default="/")
    ls.add_argument("--json", action="store_true")
    get = vol.add_parser("get")
    get.add_argument("name")
    get.add_argument("remote")
    get.add_argument("local", nargs="?", default=".")
    get.add_argument("--force", action="store_true")
    for p in (ls, get):
        p.add_argument("-e", "--env")
    app = sub.add_parser("app").add_subparsers(dest="app_command", required=True)
    logs = app.add_parser("logs")
    logs.add_argument("name")
    logs.add_argument("-f", "--follow", action="store_true")
    logs.add_argument("--tail", type=int)
    logs.add_argument("-e", "--env")
    listing = app.add_parser("list")
    listing.add_argument("--json", action="store_true")
    listing.add_argument("-e", "--env")
    stop = app.add_parser("stop")
    stop.add_argument("name")
    stop.add_argument("-y", "--yes", action="store_true")
    stop.add_argument("-e", "--env")
    args = parser.parse_args()
    if state := os.environ.get("STANDIN_MODAL_STATE_DIR"):
        with open(Path(state) / "calls.jsonl", "a") as fh:
            fh.write(json.dumps(sys.argv[1:]) + "\n")
    if args.command == "volume":
        return volume(args)
    if args.command == "app":
        if not (os.environ.get("MODAL_TOKEN_ID") and os.environ.get("MODAL_TOKEN_SECRET")):
            return _token_missing()
        _connect_to_api()
        if os.environ.get("STANDIN_MODAL_MODE") == "hang":
            time.sleep(3600)
        return {"logs": app_logs, "list": app_list, "stop": app_stop}[args.app_command](args)
    return deploy(args)


if __name__ == "__main__":
    sys.exit(main())
