"""`Sandbox`: what a rollout holds to run the model's code, traced command by command.

    async with await ctx.sandbox(memory_mb=256) as box:
        await box.write_file("solution.py", code)
        result = await box.run("python3 -m unittest -q tests", timeout_s=10)
        result.exit_code, result.stdout, result.limit

Its lifetime is its rollout's: the server ends every sandbox of a rollout when the rollout
returns, fails or is cancelled, every sandbox of the process when it drains, and any left
by a killed server when it starts again (`sweep`).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import shlex
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from synth_deploy.errors import SandboxError
from synth_deploy.sandbox._backend import (
    TERMINATED,
    CommandResult,
    SandboxBackend,
    SandboxHandle,
    SandboxTags,
)
from synth_deploy.sandbox._settings import SandboxSettings

if TYPE_CHECKING:
    from synth_deploy.tracing import SessionTracer

logger = logging.getLogger("synth_deploy.sandbox")
TRACE_OUTPUT_CHARS = 2000  # of each command's stdout and stderr, in its trace event


class Sandbox:
    """One sandbox: run commands in it, write files in and read files out."""

    def __init__(self, handle: SandboxHandle, settings: SandboxSettings, *, backend: str,
                 tracer: SessionTracer | None = None) -> None:
        self._handle = handle
        self.settings = settings
        self.backend = backend
        self.tracer = tracer
        self.busy_s = 0.0  # time its commands took, added up (the cost ledger's sandbox_s)
        self.created_at = time.monotonic()
        self._ended = False
        _live.add(self)
        self._expiry = asyncio.get_running_loop().call_later(
            settings.timeout_s, lambda: asyncio.ensure_future(self.terminate()))

    @property
    def id(self) -> str:
        return self._handle.sandbox_id

    @property
    def ended(self) -> bool:
        return self._ended

    async def run(self, command: str | Sequence[str], *, timeout_s: float | None = None,
                  stdin: str | bytes | None = None) -> CommandResult:
        """Run ``command`` (a shell line, or an argv list) and wait for it, at most
        ``timeout_s`` (the settings' ``command_timeout_s`` by default). A command that fails
        or hits a limit is a result (``exit_code``, ``limit``), not an error."""
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        text = command if isinstance(command, str) else shlex.join(argv)
        raw = await self._run(argv, text, timeout_s, stdin)
        return self._record(CommandResult(
            text, raw.exit_code, raw.stdout.decode("utf-8", "replace"),
            raw.stderr.decode("utf-8", "replace"), raw.duration_s, raw.limit, raw.truncated))

    async def write_file(self, path: str, data: str | bytes) -> None:
        """Write ``data`` to ``path`` (relative to the sandbox's working folder), making
        its folders."""
        body = data.encode() if isinstance(data, str) else data
        raw = await self._run(["/bin/sh", "-c", 'mkdir -p -- "$(dirname -- "$1")" && '
                               'cat > "$1"', "write", path],
                              f"write_file {path} ({len(body)} bytes)", None, body)
        result = self._record(CommandResult(
            f"write_file {path} ({len(body)} bytes)", raw.exit_code, "",
            raw.stderr.decode("utf-8", "replace"), raw.duration_s, raw.limit, raw.truncated))
        if not result.ok:
            raise SandboxError(f"could not write {path} in sandbox {self.id}: "
                               f"{result.stderr.strip() or result.limit or result.exit_code}",
                               hint="check the path and the sandbox's max_file_mb")

    async def read_file(self, path: str, *, max_bytes: int = 1024 * 1024) -> bytes:
        """The first ``max_bytes`` of ``path`` (relative to the working folder)."""
        raw = await self._run(["head", "-c", str(max_bytes), "--", path],
                              f"read_file {path}", None, None, output_bytes=max_bytes)
        result = self._record(CommandResult(
            f"read_file {path}", raw.exit_code, f"({len(raw.stdout)} bytes)",
            raw.stderr.decode("utf-8", "replace"), raw.duration_s, raw.limit, False))
        if not result.ok:
            raise SandboxError(f"could not read {path} in sandbox {self.id}: "
                               f"{result.stderr.strip() or result.limit or result.exit_code}",
                               hint="check that the file exists")
        return raw.stdout

    async def _run(self, argv: list[str], text: str, timeout_s: float | None,
                   stdin: str | bytes | None, *, output_bytes: int | None = None) -> Any:
        if self._ended:
            raise SandboxError(f"sandbox {self.id} has ended (its rollout finished, or its "
                               f"timeout_s={self.settings.timeout_s:g} passed)",
                               hint="ask the rollout's context for a new sandbox")
        timeout = self.settings.command_timeout_s if timeout_s is None else float(timeout_s)
        if not timeout > 0:
            raise SandboxError(f"timeout_s must be above 0, got {timeout_s!r}",
                               hint="give the command a time limit in seconds")
        data = stdin.encode() if isinstance(stdin, str) else stdin
        return await self._handle.run(
            argv, timeout_s=timeout, stdin=data,
            output_bytes=self.settings.output_bytes if output_bytes is None else output_bytes)

    def _record(self, result: CommandResult) -> CommandResult:
        self.busy_s += result.duration_s
        if self.tracer is not None:
            self.tracer.record_runtime_event(
                system_instance_id="sandbox", latency_ms=result.duration_s * 1000.0,
                metadata={"sandbox": {"id": self.id, "backend": self.backend,
                                      **result.describe(TRACE_OUTPUT_CHARS)}})
        return result

    async def terminate(self) -> None:
        """End every process in the sandbox and remove it. Idempotent."""
        if self._ended:
            return
        self._ended = True
        self._expiry.cancel()
        _live.discard(self)
        try:
            await self._handle.terminate()
        except Exception as exc:  # the sweeper finds what this could not end
            logger.warning("sandbox %s did not end cleanly: %s", self.id, exc)

    def terminate_now(self) -> None:
        """End it from outside the event loop (interpreter exit)."""
        self._ended = True
        _live.discard(self)
        with contextlib.suppress(Exception):
            self._handle.terminate_now()

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.terminate()

    def __repr__(self) -> str:
        state = "ended" if self._ended else "running"
        return f"Sandbox({self.id!r}, backend={self.backend!r}, {state})"


# Every sandbox of this process not ended yet: what a drain ends.
_live: set[Sandbox] = set()


def live_sandboxes() -> int:
    return len(_live)


async def end_all() -> int:
    """End every sandbox this process holds (the server is draining); how many."""
    held = list(_live)
    await asyncio.gather(*(s.terminate() for s in held), return_exceptions=True)
    return len(held)


@atexit.register
def _end_at_exit() -> None:
    # A server stopped before its rollouts were: nothing it started outlives it.
    for sandbox in list(_live):
        sandbox.terminate_now()


_backend: SandboxBackend | None = None


def use_backend(backend: SandboxBackend | None) -> None:
    """Make ``backend`` where this process's sandboxes run (the Modal container sets
    Modal's); None: back to the local one."""
    global _backend
    _backend = backend


def current_backend() -> SandboxBackend:
    global _backend
    if _backend is None:
        from synth_deploy.sandbox._local import LocalBackend

        _backend = LocalBackend()
    return _backend


async def open_sandbox(settings: SandboxSettings, *, app: str, rollout: str,
                       tracer: SessionTracer | None = None,
                       backend: SandboxBackend | None = None) -> Sandbox:
    """A new sandbox for ``rollout`` of ``app`` (its creation traced when ``tracer``)."""
    backend = backend or current_backend()
    started = time.perf_counter()
    handle = await backend.create(settings, SandboxTags(app=app, rollout=rollout))
    sandbox = Sandbox(handle, settings, backend=backend.name, tracer=tracer)
    if tracer is not None:
        tracer.record_runtime_event(
            system_instance_id="sandbox", latency_ms=(time.perf_counter() - started) * 1000.0,
            metadata={"sandbox": {"id": sandbox.id, "backend": backend.name,
                                  "created": settings.describe(),
                                  "network": backend.isolation()["network"]}})
    return sandbox


def lifecycle_hooks(app: str) -> tuple[Any, Any]:
    """A server's (startup, shutdown) hooks for an app that uses sandboxes: at start, end
    the app's sandboxes that a killed server left (on this machine, or on Modal), and again
    every ``sweep_every_s`` where the backend can only tell them later (a lease that must
    run out first); at stop (the drain), end every sandbox this process still holds."""
    sweeping: list[asyncio.Task[None]] = []

    async def sweep_once() -> None:
        try:
            ended = await current_backend().sweep(app)
        except Exception as exc:  # a sweep that fails is tried again, never fatal
            logger.warning("sweeping the sandboxes of %s failed: %s", app, exc)
            return
        if ended:
            logger.warning("ended %d sandbox(es) of %s left by a server that stopped without "
                           "ending them: %s", len(ended), app, ", ".join(ended[:5]))

    async def sweep_again(every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            await sweep_once()

    async def start(state: Any) -> None:
        await sweep_once()
        every_s = current_backend().sweep_every_s
        if every_s:
            sweeping.append(asyncio.create_task(sweep_again(every_s)))

    async def end(state: Any) -> None:
        for task in sweeping:
            task.cancel()
        await end_all()

    return start, end


async def close_sandboxes(sandboxes: list[Sandbox]) -> None:
    """End ``sandboxes`` (a rollout's), even while the task closing them is being
    cancelled: a sandbox is never left behind because its rollout was."""
    if not sandboxes:
        return
    held = list(sandboxes)
    sandboxes.clear()
    ending = asyncio.ensure_future(asyncio.gather(*(s.terminate() for s in held),
                                                  return_exceptions=True))
    try:
        await asyncio.shield(ending)
    except asyncio.CancelledError:
        await ending
        raise


__all__ = ["TERMINATED", "Sandbox", "close_sandboxes", "current_backend", "end_all",
           "lifecycle_hooks", "live_sandboxes", "open_sandbox", "use_backend"]
