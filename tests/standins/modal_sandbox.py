"""A stand-in for Modal's Sandboxes, as the `modal` client package shows them (1.6), on real
processes: what `ModalBackend(modal=ModalSandboxStandin(state_dir))` calls.

Modal's documented semantics, played on this machine:

- ``Sandbox.create(app=, image=, timeout=, cpu=, memory=, block_network=,
  outbound_cidr_allowlist=, workdir=, tags=)`` starts the sandbox: here a supervisor process
  of its own (its own session, so it outlives the process that created it, as a sandbox
  outlives a killed container) that ends everything in the sandbox at ``timeout`` or when
  terminated. Its ``workdir`` is a folder under the state dir.
- ``sandbox.exec(*argv, timeout=, text=False)`` runs a command in it (in its workdir, with
  no network when the sandbox blocks it, where this machine allows network namespaces) and
  returns a process: ``stdin.write/write_eof/drain``, ``stdout``/``stderr`` read by async
  iteration, ``wait()``: the exit code, 128 + N when signal N ended it, -1 when the exec's
  ``timeout`` passed (Modal kills it then).
- ``get_tags()``/``set_tags(tags)`` (replaces them), ``Sandbox.list(app_id=, tags=)``: the
  running sandboxes holding at least those tags, from any process (the records are files).
- ``terminate()`` ends every process in the sandbox; a no-op once it has finished. Calls on
  a finished sandbox raise ``exception.Error``.

Each method has Modal's ``.aio`` form (the sync form blocks, as Modal's does).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

SUPERVISOR = """
import json, os, signal, sys, time
record, deadline = sys.argv[1], time.time() + float(sys.argv[2])
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
try:
    while time.time() < deadline:
        time.sleep(0.1)
finally:
    try:
        groups = json.load(open(record)).get("groups", [])
    except (OSError, ValueError):
        groups = []
    for group in groups:
        try:
            os.killpg(group, 9)
        except OSError:
            pass
"""


class _Aio:
    """A method with Modal's two forms: ``m(...)`` blocks, ``await m.aio(...)`` does not."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        return _Bound(self.fn.__get__(obj, owner) if obj is not None else self.fn)


class _Bound:
    def __init__(self, fn: Any) -> None:
        self.aio = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return asyncio.run(self.aio(*args, **kwargs))


class Error(Exception):
    """modal.exception.Error"""


class _Image:
    def __init__(self, spec: list[str]) -> None:
        self.spec = spec

    def pip_install(self, *packages: str) -> _Image:
        return _Image([*self.spec, "pip_install " + " ".join(packages)])

    def workdir(self, path: str) -> _Image:
        return _Image([*self.spec, f"workdir {path}"])


class _Stream:
    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while chunk := await self._reader.read(65536):
            yield chunk


class _Stdin:
    def __init__(self, writer: asyncio.StreamWriter | None) -> None:
        self._writer = writer

    def write(self, data: bytes) -> None:
        if self._writer is not None:
            self._writer.write(data)

    def write_eof(self) -> None:
        if self._writer is not None:
            self._writer.close()

    @_Aio
    async def drain(self) -> None:
        if self._writer is not None:
            try:
                await self._writer.drain()
            except (BrokenPipeError, ConnectionResetError):
                pass


class _Process:
    def __init__(self, proc: asyncio.subprocess.Process, timeout: int | None) -> None:
        self._proc, self._timeout = proc, timeout
        self.stdout, self.stderr = _Stream(proc.stdout), _Stream(proc.stderr)
        self.stdin = _Stdin(proc.stdin)
        self._returncode: int | None = None

    @_Aio
    async def wait(self) -> int:
        if self._returncode is None:
            try:
                await asyncio.wait_for(self._proc.wait(), self._timeout)
                code = self._proc.returncode
                self._returncode = 128 - code if code < 0 else code
            except TimeoutError:  # Modal kills the exec at its deadline and says -1
                try:
                    os.killpg(self._proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                self._returncode = -1
        return self._returncode


class _Sandbox:
    def __init__(self, standin: ModalSandboxStandin, object_id: str) -> None:
        self._standin, self.object_id = standin, object_id
        self.folder = standin.state / "sandboxes" / object_id

    def _record(self) -> dict[str, Any]:
        return json.loads((self.folder / "record.json").read_text())

    def _save(self, record: dict[str, Any]) -> None:
        tmp = self.folder / "record.tmp"
        tmp.write_text(json.dumps(record))
        tmp.replace(self.folder / "record.json")

    def running(self) -> bool:
        try:
            record = self._record()
        except (OSError, ValueError):  # being created: not running yet
            return False
        return _alive(record["supervisor"], record["supervisor_start"])

    @_Aio
    async def exec(self, *argv: str, timeout: int | None = None, text: bool = True,
                   workdir: str | None = None) -> _Process:
        self._standin.calls.append(("Sandbox.exec", {"timeout": timeout, "text": text}))
        if text:
            raise Error("the stand-in only does text=False, as the kit asks")
        if not self.running():
            raise Error(f"Sandbox {self.object_id} has already finished")
        record = self._record()
        command = list(argv)
        if record["block_network"] and os.geteuid() == 0:
            command = ["unshare", "-n", "--", *command]
        proc = await asyncio.create_subprocess_exec(
            *command, cwd=self.folder / "root", start_new_session=True,
            env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(self.folder / "root"),
                 "STANDIN_MODAL_SANDBOX": self.object_id},
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        record = self._record()
        record["groups"].append(proc.pid)
        self._save(record)
        return _Process(proc, timeout)

    @_Aio
    async def get_tags(self) -> dict[str, str]:
        return dict(self._record()["tags"])

    @_Aio
    async def set_tags(self, tags: dict[str, str]) -> None:
        self._standin.calls.append(("Sandbox.set_tags", {"tags": tags}))
        record = self._record()
        record["tags"] = {str(k): str(v) for k, v in tags.items()}
        self._save(record)

    @_Aio
    async def terminate(self) -> None:
        record = self._record()
        if _alive(record["supervisor"], record["supervisor_start"]):
            try:
                os.kill(record["supervisor"], signal.SIGTERM)
            except ProcessLookupError:
                pass
        for group in record["groups"]:  # what the supervisor ends, ended here too
            try:
                os.killpg(group, signal.SIGKILL)
            except OSError:
                pass
        deadline = time.monotonic() + 10
        while _alive(record["supervisor"], record["supervisor_start"]) \
                and time.monotonic() < deadline:
            await asyncio.sleep(0.02)


def _start_time(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    return None if fields[0] == "Z" else int(fields[19])


def _alive(pid: int, started: int | None) -> bool:
    return started is not None and _start_time(pid) == started


class _SandboxAPI:
    def __init__(self, standin: ModalSandboxStandin) -> None:
        self._standin = standin

    @_Aio
    async def create(self, *, app: Any, image: _Image, timeout: int = 300, cpu: Any = None,
                     memory: Any = None, block_network: bool = False,
                     outbound_cidr_allowlist: Any = None, workdir: str | None = None,
                     tags: dict[str, str] | None = None) -> _Sandbox:
        standin = self._standin
        standin.calls.append(("Sandbox.create", {
            "app": app, "image": image, "timeout": timeout, "cpu": cpu, "memory": memory,
            "block_network": block_network, "outbound_cidr_allowlist": outbound_cidr_allowlist,
            "workdir": workdir, "tags": tags}))
        object_id = "sb-" + secrets.token_hex(8)
        folder = standin.state / "sandboxes" / object_id
        (folder / "root").mkdir(parents=True)
        supervisor = subprocess.Popen(
            [sys.executable, "-c", SUPERVISOR, str(folder / "record.json"), str(timeout)],
            start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        sandbox = _Sandbox(standin, object_id)
        sandbox._save({"app_id": app.app_id, "tags": dict(tags or {}), "groups": [],
                       "supervisor": supervisor.pid,
                       "supervisor_start": _start_time(supervisor.pid),
                       "block_network": block_network, "timeout": timeout,
                       "cpu": cpu, "memory": memory, "workdir": workdir,
                       "cidr_allowlist": outbound_cidr_allowlist, "image": image.spec})
        standin.created.append(object_id)
        return sandbox

    @_Aio
    async def list(self, *, app_id: str | None = None, tags: dict[str, str] | None = None
                   ) -> AsyncIterator[_Sandbox]:
        self._standin.calls.append(("Sandbox.list", {"app_id": app_id, "tags": tags}))
        for folder in sorted((self._standin.state / "sandboxes").glob("*")):
            sandbox = _Sandbox(self._standin, folder.name)
            try:
                record = sandbox._record()
            except (OSError, ValueError):
                continue
            if not sandbox.running() or (app_id and record["app_id"] != app_id):
                continue
            if all(record["tags"].get(k) == v for k, v in (tags or {}).items()):
                yield sandbox

    def from_id(self, object_id: str) -> _Sandbox:
        return _Sandbox(self._standin, object_id)


class _AppAPI:
    @_Aio
    async def lookup(self, name: str, *, create_if_missing: bool = False) -> Any:
        return SimpleNamespace(app_id=f"ap-{name}", name=name)


class ModalSandboxStandin:
    """The `modal` package's sandbox calls; its state (one folder per sandbox) under
    ``state``, shared by every process given the same folder."""

    def __init__(self, state: Path) -> None:
        self.state = Path(state)
        (self.state / "sandboxes").mkdir(parents=True, exist_ok=True)
        self.created: list[str] = []
        self.calls: list[tuple[str, dict[str, Any]]] = []  # (method, keywords) in order
        self.Sandbox = _SandboxAPI(self)
        self.App = _AppAPI()
        self.Image = SimpleNamespace(from_registry=lambda name: _Image([f"from {name}"]),
                                     debian_slim=lambda: _Image(["debian_slim"]))
        self.exception = SimpleNamespace(Error=Error)

    def install(self, client: Any) -> None:
        """Give the ``modal`` client a stand-in container imports these calls."""
        client.Sandbox, client.App, client.Image = self.Sandbox, self.App, self.Image
        # Added to what is there: another stand-in (the Dict's) puts its errors there too.
        if getattr(client, "exception", None) is None:
            client.exception = self.exception
        else:
            client.exception.Error = Error

    def processes(self, object_id: str) -> list[int]:
        """The live processes of a sandbox: its supervisor and its commands' groups."""
        try:
            record = self.Sandbox.from_id(object_id)._record()
        except (OSError, ValueError):
            return []
        groups, found = set(record["groups"]), []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2:].split()
            if fields[0] != "Z" and (int(fields[2]) in groups
                                     or int(pid) == record["supervisor"]):
                found.append(int(pid))
        return found

    def record(self, object_id: str) -> dict[str, Any]:
        return self.Sandbox.from_id(object_id)._record()
