"""The one interface every sandbox backend implements, and what a command gives back.

    backend.create(settings, tags) -> handle    # a running sandbox, tagged by app and rollout
    handle.run(argv, timeout_s=, stdin=)        # one command: its exit code and output, capped
    handle.terminate()                          # ends every process in it; idempotent
    backend.sweep(app)                          # ends the app's sandboxes nobody owns any more

`LocalBackend` (a process group in a temp directory) and `ModalBackend` (`modal.Sandbox`)
are the two; `Sandbox` wraps a handle with tracing and files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from synth_deploy.sandbox._settings import SandboxSettings

# Which limit ended a command, when it can be told.
TIMEOUT, CPU_TIME, FILE_SIZE, TERMINATED = "timeout", "cpu_time", "file_size", "terminated"


@dataclass(frozen=True)
class CommandResult:
    """One command's end. ``exit_code``: None when it was killed at its time limit or with
    its sandbox; negative for a signal (-9 SIGKILL). ``limit``: which limit ended it
    (``timeout``, ``cpu_time``, ``file_size``, ``terminated``), None when it ended on its
    own. ``stdout``/``stderr``: the first ``output_bytes`` of each, decoded; ``truncated``
    when either was longer."""

    command: str
    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float
    limit: str | None = None
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def timed_out(self) -> bool:
        return self.limit == TIMEOUT

    def describe(self, output_chars: int = 2000) -> dict[str, object]:
        """The command as its trace event records it (output cut to ``output_chars``)."""
        return {"command": self.command, "exit_code": self.exit_code,
                "duration_s": round(self.duration_s, 6), "limit": self.limit,
                "stdout": self.stdout[:output_chars], "stderr": self.stderr[:output_chars],
                "truncated": self.truncated or len(self.stdout) > output_chars
                or len(self.stderr) > output_chars}


def event_summary(record: object) -> str | None:
    """One line for a sandbox's trace event (``metadata["sandbox"]``), as `traces show`
    prints it; None when ``record`` is not one."""
    if not isinstance(record, dict):
        return None
    if "created" in record:
        return f"sandbox {record.get('id')} started ({record.get('backend')})"
    if "command" not in record:
        return None
    limit = f" · stopped by {record['limit']}" if record.get("limit") else ""
    seconds = record.get("duration_s")
    took = f" · {seconds:.3f} s" if isinstance(seconds, int | float) else ""
    return (f"sandbox $ {str(record['command'])[:200]} → exit {record.get('exit_code')}"
            f"{limit}{took}")


@dataclass(frozen=True)
class RawRun:
    """A command's end as a backend reports it: output as bytes, cut to the limit asked."""

    exit_code: int | None
    stdout: bytes
    stderr: bytes
    limit: str | None
    truncated: bool
    duration_s: float


@dataclass(frozen=True)
class SandboxTags:
    """What a sandbox is tagged with, so a sweeper can tell whose it is."""

    app: str
    rollout: str

    def as_dict(self) -> dict[str, str]:
        return {"synth_deploy_app": self.app, "synth_deploy_rollout": self.rollout}


class SandboxHandle(Protocol):
    """One running sandbox, as a backend holds it."""

    sandbox_id: str

    async def run(self, argv: list[str], *, timeout_s: float, stdin: bytes | None = None,
                  output_bytes: int) -> RawRun: ...

    async def terminate(self) -> None: ...

    def terminate_now(self) -> None:
        """End it without the event loop (interpreter exit); best effort for remote ones."""


class SandboxBackend(Protocol):
    """Where sandboxes run. ``sweep_every_s``: how often a server sweeps again after its
    start (None: once is enough, the sweeper can tell a dead owner at once)."""

    name: str
    sweep_every_s: float | None

    async def create(self, settings: SandboxSettings, tags: SandboxTags) -> SandboxHandle: ...

    async def sweep(self, app: str | None = None) -> list[str]:
        """End the sandboxes of ``app`` (every app: None) that no live server owns; the ids
        of those ended."""
        ...

    def isolation(self) -> dict[str, object]:
        """What this backend isolates on this machine, for `/health`, `check` and the docs."""
        ...


__all__ = ["CPU_TIME", "FILE_SIZE", "TERMINATED", "TIMEOUT", "CommandResult", "RawRun",
           "SandboxBackend", "SandboxHandle", "SandboxTags", "event_summary"]
