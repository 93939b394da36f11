"""`ModalBackend`: each sandbox a ``modal.Sandbox`` (a container of its own, in gVisor).

    Sandbox.create(app=, image=, timeout=, cpu=, memory=, block_network=,
                   outbound_cidr_allowlist=, workdir=, tags=)
    sandbox.exec(*argv, timeout=, text=False) -> ContainerProcess: stdin, stdout, stderr,
        wait() (-1 when the exec's timeout passed, 128 + N when signal N ended it)
    sandbox.set_tags(tags), sandbox.get_tags(), Sandbox.list(app_id=, tags=), terminate()

What Modal does not bound is bounded in the command: each runs under ``prlimit`` (or the
shell's ``ulimit``) for its largest file. Its processes are bounded by the container
(memory, CPU), not counted.

Which sandboxes a dead container left: each carries a lease (a tag, ``synth_deploy_lease``,
a time) that its container renews while it holds it; the sweeper ends the app's sandboxes
whose lease has run out. Modal itself ends a sandbox at its ``timeout`` whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from typing import Any

from synth_deploy.errors import SandboxError
from synth_deploy.sandbox._backend import CPU_TIME, FILE_SIZE, TIMEOUT, RawRun, SandboxTags
from synth_deploy.sandbox._settings import SandboxSettings

LEASE_TAG = "synth_deploy_lease"
MANAGED_TAG = "synth_deploy"  # on every sandbox the kit makes: what `sweep()` lists
DEFAULT_LEASE_S = 60.0
_EXIT_WAIT_S = 5.0
_EXEC_GRACE_S = 30.0  # past the exec's own timeout, Modal is taken not to answer
_LIMIT_SIGNALS = {24: CPU_TIME, 25: FILE_SIZE}  # SIGXCPU, SIGXFSZ
# The command under a file-size limit: prlimit where the image has it, else sh's ulimit (in
# 512-byte blocks, the smaller of the two units shells use).
_WRAPPER = ('n="$1"; shift; if command -v prlimit > /dev/null 2>&1; then '
            'exec prlimit --fsize="$n" -- "$@"; fi; ulimit -f $((n / 512)) 2> /dev/null; '
            'exec "$@"')


class ModalBackend:
    """Sandboxes on Modal, for an app deployed as ``app_name``. ``modal``: the client
    package (the real one by default; tests pass a stand-in)."""

    name = "modal"

    def __init__(self, app_name: str, *, modal: Any = None,
                 lease_s: float = DEFAULT_LEASE_S) -> None:
        self.app_name = app_name
        self._modal = modal
        self.lease_s = lease_s
        self._app: Any = None
        self.held: set[ModalSandbox] = set()
        self._renewing: asyncio.Task[None] | None = None

    @property
    def sweep_every_s(self) -> float:
        """How often a server sweeps: a killed container's leases run out within this."""
        return self.lease_s

    @property
    def modal(self) -> Any:
        if self._modal is None:
            import modal

            self._modal = modal
        return self._modal

    def isolation(self) -> dict[str, object]:
        return {"backend": self.name, "user": "a container of its own (Modal's gVisor)",
                "network": "blocked unless allowed (Modal's block_network / cidr allowlist)",
                "limits": ["cpu", "memory", "file size", "lifetime"],
                "not_isolated": []}

    async def _app_handle(self) -> Any:
        if self._app is None:
            self._app = await self.modal.App.lookup.aio(self.app_name, create_if_missing=True)
        return self._app

    def _image(self, settings: SandboxSettings) -> Any:
        image = (self.modal.Image.from_registry(settings.image) if settings.image
                 else self.modal.Image.debian_slim())
        if settings.packages:
            image = image.pip_install(*settings.packages)
        return image.workdir(settings.workdir)

    def lease(self) -> str:
        return f"{time.time() + self.lease_s:.0f}"

    async def create(self, settings: SandboxSettings, tags: SandboxTags) -> ModalSandbox:
        error = self.modal.exception.Error
        extra: dict[str, Any] = {}
        if settings.cidr_allowlist:
            extra["outbound_cidr_allowlist"] = list(settings.cidr_allowlist)
        labels = {**tags.as_dict(), MANAGED_TAG: "1", LEASE_TAG: self.lease()}
        try:
            sandbox = await self.modal.Sandbox.create.aio(
                app=await self._app_handle(), image=self._image(settings),
                timeout=math.ceil(settings.timeout_s), cpu=(settings.cpu, settings.cpu),
                memory=(settings.memory_mb, settings.memory_mb),
                block_network=settings.blocks_network, workdir=settings.workdir,
                tags=labels, **extra)
        except error as exc:
            raise SandboxError(f"Modal could not create a sandbox for {self.app_name}: {exc}",
                               hint="check the image name and the workspace's sandbox "
                                    "quota (`modal app logs` says more)") from exc
        held = ModalSandbox(self, sandbox, settings, labels)
        self.held.add(held)
        if self._renewing is None or self._renewing.done():
            self._renewing = asyncio.create_task(self._renew())
        return held

    async def _renew(self) -> None:
        """Keep the leases of the sandboxes this process holds from running out."""
        while self.held:
            await asyncio.sleep(self.lease_s / 3)
            for held in list(self.held):
                held.labels[LEASE_TAG] = self.lease()
                with contextlib.suppress(Exception):  # the next pass tries again
                    await held.sandbox.set_tags.aio(dict(held.labels))

    async def sweep(self, app: str | None = None) -> list[str]:
        """End the sandboxes of ``app`` (every app of the kit: None) whose lease ran out."""
        wanted = {MANAGED_TAG: "1", **({"synth_deploy_app": app} if app else {})}
        app_handle = await self._app_handle()
        ours = {h.sandbox_id for h in self.held}
        ended = []
        async for sandbox in self.modal.Sandbox.list.aio(app_id=app_handle.app_id,
                                                          tags=wanted):
            if sandbox.object_id in ours:
                continue
            labels = await sandbox.get_tags.aio()
            try:
                until = float(labels.get(LEASE_TAG, "0"))
            except ValueError:
                until = 0.0
            if until < time.time():
                await sandbox.terminate.aio()
                ended.append(sandbox.object_id)
        return ended


class ModalSandbox:
    """One ``modal.Sandbox`` held by this process."""

    def __init__(self, backend: ModalBackend, sandbox: Any, settings: SandboxSettings,
                 labels: dict[str, str]) -> None:
        self.backend, self.sandbox, self.settings, self.labels = (
            backend, sandbox, settings, labels)
        self.sandbox_id = sandbox.object_id
        self.ended = False

    async def run(self, argv: list[str], *, timeout_s: float, stdin: bytes | None = None,
                  output_bytes: int) -> RawRun:
        if self.ended:
            raise SandboxError(f"sandbox {self.sandbox_id} has ended",
                               hint="ask the rollout's context for a new sandbox")
        started = time.perf_counter()
        limit_bytes = str(self.settings.max_file_mb * 1024 * 1024)
        try:
            proc = await self.sandbox.exec.aio("sh", "-c", _WRAPPER, "sh", limit_bytes, *argv,
                                               timeout=math.ceil(timeout_s), text=False)
            if stdin is not None:
                proc.stdin.write(stdin)
                proc.stdin.write_eof()
                await proc.stdin.drain.aio()
            reading = asyncio.gather(_head(proc.stdout, output_bytes),
                                     _head(proc.stderr, output_bytes))
            code = await asyncio.wait_for(proc.wait.aio(), timeout_s + _EXEC_GRACE_S)
            (out, cut_out), (err, cut_err) = await asyncio.wait_for(reading, _EXEC_GRACE_S)
        except TimeoutError:
            return RawRun(None, b"", b"", TIMEOUT, False, time.perf_counter() - started)
        except self.backend.modal.exception.Error as exc:
            raise SandboxError(f"sandbox {self.sandbox_id} could not run {argv[0]!r}: {exc}",
                               hint="the sandbox may have reached its timeout_s") from exc
        limit = TIMEOUT if code == -1 else _LIMIT_SIGNALS.get(code - 128)
        return RawRun(None if limit == TIMEOUT else code, out, err, limit, cut_out or cut_err,
                      time.perf_counter() - started)

    async def terminate(self) -> None:
        self.ended = True
        self.backend.held.discard(self)
        await self.sandbox.terminate.aio()

    def terminate_now(self) -> None:
        # At interpreter exit: Modal's blocking call, given a few seconds on a thread of its
        # own so that an unreachable API cannot hold the exit (the lease and Modal's own
        # timeout end what this could not).
        self.ended = True
        self.backend.held.discard(self)
        ending = threading.Thread(target=self.sandbox.terminate, daemon=True)
        ending.start()
        ending.join(_EXIT_WAIT_S)


async def _head(stream: Any, limit: int) -> tuple[bytes, bool]:
    """The first ``limit`` bytes of ``stream``, read to its end (the rest counted, not
    kept), and whether there was more."""
    kept, more = bytearray(), False
    async for chunk in stream:
        data = chunk.encode() if isinstance(chunk, str) else chunk
        room = limit - len(kept)
        if room > 0:
            kept += data[:room]
        more = more or len(data) > room
    return bytes(kept), more


__all__ = ["LEASE_TAG", "MANAGED_TAG", "ModalBackend", "ModalSandbox"]
