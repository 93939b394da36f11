"""`pull_traces`: a deployed app's traces, from its trace Volume into a local store.

The Volume holds each container's files, each what it recorded in an interval: copies of its
session log, and SQLite segments (see `_trace_volume`). A pull lists the app's folder with
`modal volume ls --json`, downloads each file it has not merged yet, or whose size or time
changed since (`modal volume get`, into a partial file renamed when whole), and merges its
sessions into the store, then removes its copy. Each `modal volume get` is a process and a
connection of its own (0.7 s to start, before it connects), and a busy container leaves
hundreds of files an hour: when several files are new (`ONE_FETCH_FROM`) and the folder
holds no more bytes already merged than new ones, the whole folder comes in one `get`
(Modal's CLI fetches its files in parallel), so a pull after a long run costs one call, not
one per file, and at most twice the bytes it needs. Files fetched one by one (a pull during
a run: a few new beside many merged) run `FETCHES_AT_ONCE` calls at a time, ahead of the
merge. A ledger beside the downloads records each file once merged (with a session of it, so
that a store made afresh gets every file again): a second pull downloads and reads nothing
it merged before, a pull cut short starts again from the first file it had not finished, and
a session merged before is skipped in any case (`merge_trace_file`). A file that cannot be
read (`UnreadFile`: damaged, or from a newer kit) stops nothing: it is left out of the
ledger, its copy kept, the other files merged, and the next pull tries it again. Modal is
reached only through `ModalCLI`, a bounded child process (tests pass a stand-in `modal`).
"""

from __future__ import annotations

import collections
import json
import os
import shlex
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from synth_deploy.env import Env
from synth_deploy.errors import DeployError, TraceStoreError
from synth_deploy.modal._credentials import require_modal_token
from synth_deploy.modal._modal_cli import ModalCLI, ModalCLIError
from synth_deploy.modal._plan import deployed_trace_destination
from synth_deploy.modal._reachability import DEFAULT_CONNECT_TIMEOUT_S, require_modal_reachable
from synth_deploy.modal._trace_volume import default_trace_volume, trace_file_container
from synth_deploy.tracing import (
    NotATraceDbError,
    SchemaTooNewError,
    TraceDbMissingError,
    TraceFormatError,
)

DEFAULT_PULL_TIMEOUT_S = 300.0
LEDGER_NAME = "pulled.json"
# How many new files make a pull fetch the app's folder in one `modal volume get`.
ONE_FETCH_FROM = 4
# How many `modal volume get` calls of one file each run at once, ahead of the merge (so at
# most this many copies wait on disk): each call is mostly its start and its connection.
FETCHES_AT_ONCE = 4
_FETCHING = ".fetching"  # where a folder fetch lands, beside the ledger
# What reading one file raises when that file is at fault: it is skipped and named. The
# store's own failures (a full disk, a locked database) stop the pull.
_FILE_FAULTS = (NotATraceDbError, SchemaTooNewError, TraceDbMissingError, TraceFormatError)


@dataclass(frozen=True)
class VolumeFile:
    """A container's trace file as `modal volume ls` lists it."""

    path: str  # in the Volume: <app name>/<container id>.<n>.log (or .db)
    size: int
    modified: str

    @property
    def container(self) -> str:
        return trace_file_container(Path(self.path).name) or Path(self.path).name


@dataclass(frozen=True)
class FilePull:
    """What a pull did with one container's file."""

    container: str
    bytes: int  # downloaded (0: unchanged since the last pull)
    added: int
    skipped: int
    amended: int = 0  # of those skipped, marked as answers lost since (`MergeResult`)


@dataclass(frozen=True)
class ContainerPull:
    """What a pull did with one container's files."""

    container: str
    files: int
    bytes: int
    added: int
    skipped: int


@dataclass(frozen=True)
class UnreadFile:
    """A file a pull could not read: not merged, not in the ledger (the next pull tries it
    again), its copy kept for a look."""

    path: str  # in the Volume
    container: str
    reason: str
    hint: str
    inspect: str  # the command that fetches it as the Volume holds it
    copy: str  # where this pull's copy of it is kept


@dataclass(frozen=True)
class PullResult:
    volume: str
    folder: str
    trace_db: str
    files: list[FilePull] = field(default_factory=list)
    unread: list[UnreadFile] = field(default_factory=list)

    @property
    def added(self) -> int:
        return sum(f.added for f in self.files)

    @property
    def skipped(self) -> int:
        return sum(f.skipped for f in self.files)

    @property
    def amended(self) -> int:
        return sum(f.amended for f in self.files)

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    @property
    def containers(self) -> list[ContainerPull]:
        """What each container's files gave, in the order first listed."""
        by_container: dict[str, ContainerPull] = {}
        for f in self.files:
            seen = by_container.get(f.container) or ContainerPull(f.container, 0, 0, 0, 0)
            by_container[f.container] = ContainerPull(
                f.container, seen.files + 1, seen.bytes + f.bytes, seen.added + f.added,
                seen.skipped + f.skipped)
        return list(by_container.values())

    def to_dict(self) -> dict[str, Any]:
        return {"volume": self.volume, "folder": self.folder, "trace_db": self.trace_db,
                "files": len(self.files), "downloaded": sum(1 for f in self.files if f.bytes),
                "sessions_added": self.added, "sessions_skipped": self.skipped,
                "sessions_amended": self.amended,
                "bytes": self.bytes, "containers": [asdict(c) for c in self.containers],
                "unread": [asdict(u) for u in self.unread]}


class TraceVolume:
    """A trace Volume as the laptop reads it: Modal's CLI, each call bounded."""

    def __init__(self, name: str, env: Env, *, cli: ModalCLI | None = None,
                 timeout_s: float = DEFAULT_PULL_TIMEOUT_S) -> None:
        self.name = name
        self.env = env
        self.cli = cli or ModalCLI()
        self.timeout_s = timeout_s

    def _run(self, args: list[str], what: str, timeout_s: float | None = None,
             cancel: threading.Event | None = None) -> list[str]:
        run = self.cli.run(["volume", *args], env=dict(self.env.values),
                           timeout_s=timeout_s or self.timeout_s, cancel=cancel)
        if run.returncode != 0:
            text = "\n".join(run.output)
            if "not found" in text and "Volume" in text:
                raise ModalCLIError(
                    f"the Modal Volume {self.name!r} does not exist",
                    hint="give the task app's id, the Modal app name `deploy` printed, or "
                         "the Volume with --volume (`modal volume list` shows them)",
                    output=run.output)
            raise run.error(what)
        return run.output

    def files(self, folder: str) -> list[VolumeFile]:
        """The trace files in ``folder`` (none when the folder does not exist yet)."""
        try:
            lines = self._run(["ls", self.name, folder, "--json"], "modal volume ls")
        except ModalCLIError as exc:
            if "No such file or directory" in "\n".join(exc.output):
                return []
            raise
        text = "\n".join(lines)
        try:
            rows = json.loads(text[text.index("["):text.rindex("]") + 1])
        except ValueError:
            raise ModalCLIError("`modal volume ls --json` printed no listing",
                                hint="is the installed modal recent? "
                                     "(pip install -U 'modal>=1.0,<2')", output=lines) from None
        return sorted((VolumeFile(r["filename"], int(r["size"] or 0),
                                  str(r.get("created_modified"))) for r in rows
                       if r.get("type") == "file"
                       and trace_file_container(Path(r["filename"]).name)),
                      key=lambda f: f.path)

    def download(self, file: VolumeFile, dest: Path,
                 cancel: threading.Event | None = None) -> None:
        """``file`` to ``dest``, which holds either the old copy or the whole new one
        (``cancel``: set, it stops the call)."""
        partial = dest.with_name(dest.name + ".partial")
        self._run(["get", self.name, file.path, str(partial), "--force"], "modal volume get",
                  cancel=cancel)
        os.replace(partial, dest)

    def download_folder(self, folder: str, dest: Path, size: int) -> Path:
        """Every file in ``folder`` (``size`` bytes, as listed) into the empty directory
        ``dest``, in one call; the directory they are in (Modal's CLI puts them under the
        folder's own name). A large folder gets time at 1 MB/s at least."""
        self._run(["get", self.name, folder, str(dest)], "modal volume get",
                  timeout_s=max(self.timeout_s, size / 1e6))
        return dest / folder


def pull_traces(app: str, store: Any, env: Env, *, volume: str | None = None,
                download_dir: Path | None = None, cli: ModalCLI | None = None,
                connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
                on_file: Callable[[int, int], None] | None = None) -> PullResult:
    """Merge into ``store`` (an open `TraceStore`) every session a deployed app committed
    to its trace Volume.

    ``app``: a task app id or file (its Modal app name and Volume are the deploy's, as its
    `ModalSettings` give them), else a Modal app's own name (Volume ``<app>-traces``);
    ``volume`` names the Volume outright. ``download_dir`` keeps the files and the ledger
    between pulls (default: ``pulled/`` beside a local store, ``traces/pulled`` for a
    remote one); ``on_file(done, total)`` hears each file finished; a file that cannot be
    read is in the result's ``unread``, the others merged. Raises `DeployError`
    with the fix when Modal is not reachable, has no token, or has no such Volume, and when
    the app records nowhere a pull can reach.
    """
    app_name, name = _volume_of(app, env, volume)
    require_modal_token(env)
    require_modal_reachable(env, connect_timeout_s)
    trace_volume = TraceVolume(name, env, cli=cli)
    files = trace_volume.files(app_name)
    folder = _pull_folder(store, download_dir, name, app_name)
    ledger_path = folder / LEDGER_NAME
    ledger = _read_ledger(ledger_path)
    result = PullResult(volume=name, folder=app_name, trace_db=store.display)
    # Merged into this store before and unchanged since (a segment never changes): skipped.
    merged = {f.path for f in files if _still_merged(ledger.get(f.path), f, store)}
    new = [f for f in files if f.path not in merged]
    # Several new files, and no more bytes merged already than new: the folder in one call.
    together = len(new) >= ONE_FETCH_FROM and _bytes(files) <= 2 * _bytes(new)
    staging, fetched, singles = folder / _FETCHING, None, None
    try:
        if together:
            if on_file is not None:
                on_file(0, len(files))
            shutil.rmtree(staging, ignore_errors=True)  # what a pull cut short left
            staging.mkdir()
            fetched = trace_volume.download_folder(app_name, staging, _bytes(files))
        singles = _Fetches(trace_volume, [
            (f, folder / Path(f.path).name) for f in new
            if fetched is None or not (fetched / Path(f.path).name).is_file()])
        for done, file in enumerate(files, 1):
            if file.path in merged:
                result.files.append(FilePull(file.container, 0, 0,
                                             ledger[file.path]["added"]))
            else:
                local = _fetched(file, folder, fetched, singles)
                try:
                    result.files.append(_merge_one(store, file, local, ledger))
                except _FILE_FAULTS as exc:
                    result.unread.append(_unread(trace_volume.name, file, local, exc))
                else:
                    _write_ledger(ledger_path, ledger)
                    local.unlink()  # its sessions are in the store: a copy would double the disk
            if on_file is not None:
                on_file(done, len(files))
    finally:
        if singles is not None:
            singles.close()
        if together:  # the copies of files merged before, and of any listed after
            shutil.rmtree(staging, ignore_errors=True)
    return result


def _pull_folder(store: Any, download_dir: Path | None, volume: str, app_name: str) -> Path:
    """Where a pull keeps its copies and ledger: ``download_dir`` (default: ``pulled/``
    beside a local store, ``traces/pulled`` for a remote one), by Volume and app."""
    if download_dir is None:
        path = store.setting.path
        download_dir = (path.parent if path is not None and not store.setting.is_remote
                        else Path("traces")) / "pulled"
    folder = download_dir / volume / app_name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _fetched(file: VolumeFile, folder: Path, fetched: Path | None, singles: Any) -> Path:
    """``file``'s local copy, once in place: from the folder fetched whole, else its own
    download."""
    local = folder / Path(file.path).name
    early = None if fetched is None else fetched / local.name
    if early is not None and early.is_file():
        os.replace(early, local)
    else:
        singles.wait(file)
    return local


class _Fetches:
    """Downloads ``files`` ((file, local copy) each, in the order they are merged)
    `FETCHES_AT_ONCE` at a time; `wait` returns once the next one is in place."""

    def __init__(self, volume: TraceVolume, files: list[tuple[VolumeFile, Path]]) -> None:
        self._volume = volume
        self._waiting = collections.deque(files)
        self._started: dict[str, tuple[Future[None], Path]] = {}
        self._pool = ThreadPoolExecutor(FETCHES_AT_ONCE, thread_name_prefix="modal-volume-get")
        self._cancel = threading.Event()
        self._start_more()

    def _start_more(self) -> None:
        while self._waiting and len(self._started) < FETCHES_AT_ONCE:
            file, local = self._waiting.popleft()
            self._started[file.path] = (
                self._pool.submit(self._volume.download, file, local, self._cancel), local)

    def wait(self, file: VolumeFile) -> None:
        """Block until ``file`` is downloaded (raising its call's error), and start the
        next."""
        future, _ = self._started.pop(file.path)
        future.result()
        self._start_more()

    def close(self) -> None:
        """Start nothing more, stop the calls under way (a pull cut short by an error or
        Ctrl-C, which reaches only the main thread, ends now), and remove the copies no
        merge took."""
        self._waiting.clear()
        self._cancel.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
        for _, local in self._started.values():
            local.unlink(missing_ok=True)
            local.with_name(local.name + ".partial").unlink(missing_ok=True)


def _bytes(files: list[VolumeFile]) -> int:
    return sum(f.size for f in files)


def _stamp(file: VolumeFile) -> dict[str, Any]:
    return {"size": file.size, "modified": file.modified}


def _merge_one(store: Any, file: VolumeFile, local: Path,
               ledger: dict[str, Any]) -> FilePull:
    """Merge ``local`` (the copy of ``file``); the ledger records it with one of its
    sessions."""
    from synth_deploy.tracing import merge_trace_file  # the read side: not in a container

    fetched = local.stat().st_size
    merged = merge_trace_file(store, local)
    # What a later pull reports as already here: the sessions this file brought.
    ledger[file.path] = {**_stamp(file), "added": merged.added, "probe": merged.probe}
    return FilePull(file.container, fetched, merged.added, merged.skipped, merged.amended)


def _unread(volume: str, file: VolumeFile, local: Path, exc: TraceStoreError) -> UnreadFile:
    if isinstance(exc, SchemaTooNewError):  # good data: a newer kit reads it
        hint = f"{exc.hint}, then pull again: the file stays on the Volume and merges then"
    else:
        hint = ("the other files were merged; the next pull tries this one again (a file "
                "fetched while it was written merges then)")
    inspect = shlex.join(["modal", "volume", "get", volume, file.path, local.name])
    reason = exc.message.replace(str(local), "its copy")  # the path is said once, as `copy`
    return UnreadFile(file.path, file.container, reason, hint, inspect, str(local))


def _still_merged(entry: Any, file: VolumeFile, store: Any) -> bool:
    """Whether the ledger's ``entry`` says this version of ``file`` was merged into
    ``store``: its probe session is there (a store made afresh since has none)."""
    stamp = _stamp(file)
    if not (isinstance(entry, dict) and {k: entry.get(k) for k in stamp} == stamp
            and isinstance(entry.get("added"), int)):
        return False
    probe = entry.get("probe")
    return probe is None or bool(store.database.stored_ids([probe]))


def _read_ledger(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # no ledger, or a damaged one: every file is downloaded again
    return data if isinstance(data, dict) else {}


def _write_ledger(path: Path, ledger: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(ledger, indent=1, sort_keys=True))
    os.replace(tmp, path)


def _volume_of(app: str, env: Env, volume: str | None) -> tuple[str, str]:
    """(the Modal app name, its trace Volume) for ``app`` as `pull_traces` takes it."""
    destination = deployed_trace_destination(app, env)
    if destination is None:  # a Modal app's own name
        return app, volume or default_trace_volume(app)
    if volume is None and destination.volume is None:
        raise DeployError(f"{app}: nothing to pull: {destination.describe}",
                          hint="give the Volume with --volume if the app was deployed with "
                               "another setting")
    return destination.app_name, volume or destination.volume


__all__ = ["DEFAULT_PULL_TIMEOUT_S", "ContainerPull", "FilePull", "PullResult", "TraceVolume",
           "UnreadFile", "VolumeFile", "pull_traces"]
