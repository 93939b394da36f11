"""`LocalBackend`: a sandbox as a temp directory and the processes started in it.

Each command runs in its own process group, in the sandbox's directory, with its limits set
before it starts (setrlimit: CPU time, address space, file size, processes, no core
files) and, unless the sandbox may use the network, in a network namespace of its own with
no interface but a loopback that is down. When the server runs as root each sandbox also
gets a user of its own (a uid nobody else has): its processes cannot signal the server or
read what only the server's user may, the process limit counts its processes alone, and
ending the sandbox ends every process of that user, wherever it went.

What it does not isolate (say so to whoever trusts it): the host's filesystem is visible as
any other local user sees it; the disk is bounded per file, not in total; memory is bounded
per process (address space), not in total; without root the sandbox runs as the server's
own user (its files are readable, and a process that leaves its group and clears its
environment escapes the sweep); the image and packages settings are ignored (the host's
programs run). For untrusted code in production use the Modal backend.

Each sandbox is a directory ``<root>/<app>/<rollout>-<id>/`` holding ``sandbox.json`` (the
app, rollout, owning server process, user and process groups) beside its ``work/``
directory: what `LocalBackend.sweep` reads to end the sandboxes a killed server left.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import itertools
import json
import math
import os
import re
import resource
import secrets
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from synth_deploy.errors import SandboxError
from synth_deploy.sandbox._backend import (
    CPU_TIME,
    FILE_SIZE,
    TERMINATED,
    TIMEOUT,
    RawRun,
    SandboxTags,
)
from synth_deploy.sandbox._processes import MARKER_NAME, alive, end_processes, start_time
from synth_deploy.sandbox._settings import SandboxSettings

MARKER_FILE = "sandbox.json"
_CLONE_NEWNET, _CLONE_NEWUSER = 0x40000000, 0x10000000
_UIDS = (3_000_000, 2_000_000_000)  # far above any real account's
_PATH = "/usr/local/bin:/usr/bin:/bin"
_MB = 1024 * 1024
_LIMIT_SIGNALS = {signal.SIGXCPU: CPU_TIME, signal.SIGXFSZ: FILE_SIZE}


def default_root() -> Path:
    """Where local sandboxes live unless told otherwise: one folder per machine user."""
    return Path(tempfile.gettempdir()) / f"synth-deploy-sandboxes-{os.geteuid()}"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:64] or "_"


class LocalBackend:
    """Sandboxes on this machine (see the module docstring for what they isolate)."""

    name = "local"
    sweep_every_s = None  # a dead owner is told at once: its process is gone

    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()
        self.own_users = hasattr(os, "setuid") and os.geteuid() == 0
        self._netns: bool | None = None
        self._libc: Any = None
        self._reachable = False

    def _check_reachable(self) -> None:
        """A sandbox's own user must pass every folder above its own (python3 opens a script
        by its absolute path): refuse a root it could not reach, naming the folder."""
        self.root.mkdir(mode=0o711, parents=True, exist_ok=True)
        for folder in (self.root, *self.root.resolve().parents):
            if not folder.stat().st_mode & 0o001:
                raise SandboxError(
                    f"sandboxes under {self.root} cannot reach their folder: {folder} is "
                    "closed to other users, and each sandbox runs as a user of its own",
                    hint=f"chmod o+x {folder}, or give LocalBackend a root under a folder "
                         "anyone may pass (the default is under the temp folder)")
        self._reachable = True

    def _network_namespaces(self) -> bool:
        """Whether this process may give a child a network namespace (probed once)."""
        if self._netns is None:
            try:
                self._libc = ctypes.CDLL(None, use_errno=True)
                flags = _CLONE_NEWNET | (0 if self.own_users else _CLONE_NEWUSER)
                libc = self._libc
                pid = os.fork()
                if pid == 0:  # the child only makes the call and exits: nothing else runs
                    os._exit(0 if libc.unshare(flags) == 0 else 1)
                _, status = os.waitpid(pid, 0)
                self._netns = os.waitstatus_to_exitcode(status) == 0
            except (OSError, AttributeError):
                self._netns = False
        return self._netns

    def isolation(self) -> dict[str, object]:
        netns = self._network_namespaces()
        return {
            "backend": self.name,
            "user": "a uid of its own per sandbox" if self.own_users else
                    "the server's own user (run as root for a uid per sandbox)",
            "network": "blocked (a network namespace per command)" if netns else
                       "NOT blocked: this machine does not allow network namespaces",
            "limits": ["cpu time", "address space", "file size", "processes"],
            "not_isolated": ["the host filesystem (read as any local user)",
                             "total disk and memory (bounded per file and per process)",
                             "image and packages (the host's programs run)"],
        }

    async def create(self, settings: SandboxSettings, tags: SandboxTags) -> LocalSandbox:
        # Without root, a user namespace of its own is what makes the process limit count
        # this sandbox's processes alone (and what lets it have a network namespace).
        namespaces = 0
        if self._network_namespaces():
            namespaces = (0 if self.own_users else _CLONE_NEWUSER) | (
                _CLONE_NEWNET if not settings.network else 0)
        sandbox_id = "sb-" + secrets.token_hex(8)
        folder = self.root / _slug(tags.app) / f"{_slug(tags.rollout)}-{sandbox_id}"
        uid = secrets.choice(range(*_UIDS)) if self.own_users else None
        if self.own_users and not self._reachable:
            self._check_reachable()
        try:
            self.root.mkdir(mode=0o711, parents=True, exist_ok=True)
            folder.parent.mkdir(mode=0o711, exist_ok=True)
            folder.mkdir(mode=0o711)
            (folder / "out").mkdir(mode=0o700)
            work = folder / "work"
            work.mkdir(mode=0o700)
            if uid is not None:
                os.chown(work, uid, uid)
        except OSError as exc:
            raise SandboxError(f"cannot make a sandbox under {self.root}: {exc}",
                               hint="make the folder writable, or give LocalBackend another "
                                    "root") from exc
        sandbox = LocalSandbox(sandbox_id, folder, settings, tags, uid=uid,
                               namespaces=namespaces, libc=self._libc)
        sandbox.save()
        return sandbox

    async def sweep(self, app: str | None = None) -> list[str]:
        return await asyncio.to_thread(self.sweep_now, app)

    def sweep_now(self, app: str | None = None) -> list[str]:
        """End the sandboxes under this root whose server is gone (of ``app`` only, when
        given): their processes killed, their folders removed. The ids of those ended."""
        ended = []
        apps = [self.root / _slug(app)] if app else (
            sorted(p for p in self.root.iterdir() if p.is_dir()) if self.root.is_dir() else [])
        for app_dir in apps:
            if not app_dir.is_dir():
                continue
            for folder in sorted(p for p in app_dir.iterdir() if p.is_dir()):
                record = _read_marker(folder)
                if record is None:
                    # Made but never marked (its server died in between): nothing ran in it.
                    if time.time() - folder.stat().st_mtime > 60:
                        shutil.rmtree(folder, ignore_errors=True)
                    continue
                if alive(record.get("owner_pid", -1), record.get("owner_start")):
                    continue  # a live server's: it ends it
                end_processes(record["id"], uid=record.get("uid"),
                              groups=record.get("groups", []))
                shutil.rmtree(folder, ignore_errors=True)
                ended.append(record["id"])
        return ended


def _read_marker(folder: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((folder / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("id"), str) else None


class LocalSandbox:
    """One local sandbox: its folder, its user, the process groups of its commands."""

    def __init__(self, sandbox_id: str, folder: Path, settings: SandboxSettings,
                 tags: SandboxTags, *, uid: int | None, namespaces: int, libc: Any) -> None:
        self.sandbox_id = sandbox_id
        self.folder, self.work = folder, folder / "work"
        self.settings, self.tags, self.uid = settings, tags, uid
        self.namespaces, self._libc = namespaces, libc
        self.groups: list[int] = []
        self.ended = False
        self._count = itertools.count()
        self._lock = threading.Lock()  # terminate_now may run on another thread (atexit)

    def save(self) -> None:
        """The marker the sweeper reads: written whole (a new file renamed over the old)."""
        me = os.getpid()
        record = {"id": self.sandbox_id, "app": self.tags.app, "rollout": self.tags.rollout,
                  "owner_pid": me, "owner_start": start_time(me), "uid": self.uid,
                  "groups": self.groups, "created": time.time(),
                  "timeout_s": self.settings.timeout_s}
        tmp = self.folder / f".{MARKER_FILE}.tmp"
        tmp.write_text(json.dumps(record))
        tmp.replace(self.folder / MARKER_FILE)

    def _child_setup(self, timeout_s: float):
        """What the child does between fork and exec: its namespace, limits and user."""
        s, uid, libc, work = self.settings, self.uid, self._libc, str(self.work)
        flags = self.namespaces
        cpu = math.ceil(timeout_s) + 1
        limits = [(resource.RLIMIT_CPU, (cpu, cpu + 1)),
                  (resource.RLIMIT_AS, (s.memory_mb * _MB,) * 2),
                  (resource.RLIMIT_FSIZE, (s.max_file_mb * _MB,) * 2),
                  (resource.RLIMIT_CORE, (0, 0))]
        if uid is not None:  # counted per user: only a user of its own makes it per sandbox
            limits.append((resource.RLIMIT_NPROC, (s.max_processes,) * 2))

        def setup() -> None:
            # Here, not Popen's process_group and cwd: uvloop has no process_group, and
            # changes directory after this, as the sandbox's user, who may not pass the
            # folders above its own.
            os.setpgid(0, 0)
            os.chdir(work)
            if flags and libc.unshare(flags) != 0:
                os._exit(125)  # never run with the network it was to be denied
            if flags & _CLONE_NEWUSER:  # its own user namespace: the limit counts it alone
                resource.setrlimit(resource.RLIMIT_NPROC, (s.max_processes,) * 2)
            for which, value in limits:
                resource.setrlimit(which, value)
            if uid is not None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
        return setup

    async def run(self, argv: list[str], *, timeout_s: float, stdin: bytes | None = None,
                  output_bytes: int) -> RawRun:
        if self.ended:
            raise SandboxError(f"sandbox {self.sandbox_id} has ended",
                               hint="ask the rollout's context for a new sandbox")
        n = next(self._count)
        out_path, err_path = self.folder / "out" / f"{n}.out", self.folder / "out" / f"{n}.err"
        env = {"PATH": _PATH, "HOME": str(self.work), "TMPDIR": str(self.work),
               "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", MARKER_NAME: self.sandbox_id}
        started = time.perf_counter()
        limit: str | None = None
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv, env=env, stdout=out, stderr=err,
                    stdin=asyncio.subprocess.PIPE if stdin is not None
                    else asyncio.subprocess.DEVNULL,
                    preexec_fn=self._child_setup(timeout_s))
            except OSError as exc:
                raise SandboxError(f"sandbox {self.sandbox_id} could not start "
                                   f"{argv[0]!r}: {exc}", hint="check the program is "
                                   "installed and the sandbox root is writable") from exc
        with self._lock:
            if self.ended:  # ended while it started: past the sweep that would have found it
                _kill_group(proc.pid)
            else:
                self.groups.append(proc.pid)
                self.save()
        try:
            await asyncio.wait_for(_feed_and_wait(proc, stdin), timeout_s)
        except TimeoutError:
            limit = TIMEOUT
            _kill_group(proc.pid)
            await proc.wait()
        except asyncio.CancelledError:
            _kill_group(proc.pid)  # the rollout is gone: so is its command
            raise
        duration = time.perf_counter() - started
        code = proc.returncode
        if limit is None and self.ended:
            limit = TERMINATED
        elif limit is None and code is not None:
            # Killed by the signal a limit sends: itself, or the child its shell reports.
            limit = _LIMIT_SIGNALS.get(-code) or _LIMIT_SIGNALS.get(code - 128)
        if limit in (TIMEOUT, TERMINATED):
            code = None
        stdout, cut_out = _head(out_path, output_bytes)
        stderr, cut_err = _head(err_path, output_bytes)
        return RawRun(code, stdout, stderr, limit, cut_out or cut_err, duration)

    async def terminate(self) -> None:
        await asyncio.to_thread(self.terminate_now)

    def terminate_now(self) -> None:
        with self._lock:
            self.ended = True
            end_processes(self.sandbox_id, uid=self.uid, groups=self.groups)
            shutil.rmtree(self.folder, ignore_errors=True)


async def _feed_and_wait(proc: asyncio.subprocess.Process, data: bytes | None) -> None:
    if data is not None and proc.stdin is not None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(data)
            await proc.stdin.drain()
        proc.stdin.close()
    await proc.wait()


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _head(path: Path, limit: int) -> tuple[bytes, bool]:
    """The first ``limit`` bytes of ``path`` and whether there was more; the file removed."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
        path.unlink()
    except OSError:
        return b"", False
    return data[:limit], len(data) > limit


__all__ = ["MARKER_FILE", "LocalBackend", "LocalSandbox", "default_root"]
