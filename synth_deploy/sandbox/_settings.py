"""`SandboxSettings`: what a sandbox is made with, checked when it is built."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, replace
from typing import Any

from synth_deploy.errors import UsageError

DEFAULT_TIMEOUT_S = 600.0  # a sandbox's whole life, however many commands it runs
DEFAULT_COMMAND_TIMEOUT_S = 30.0
DEFAULT_OUTPUT_BYTES = 64 * 1024  # of stdout and of stderr, each, per command
DEFAULT_MEMORY_MB = 512
DEFAULT_MAX_FILE_MB = 256
DEFAULT_MAX_PROCESSES = 64


@dataclass(frozen=True)
class SandboxSettings:
    """A sandbox's image, limits and network, stated once (on the `TaskApp`, or per call to
    ``ctx.sandbox(...)``).

    ``image``: a registry image (``python:3.12-slim``) for Modal's sandboxes; ``packages``:
    pip packages installed into it. The local backend runs the host's own programs and
    ignores both (see `LocalBackend`). ``timeout_s``: the sandbox's whole life;
    ``command_timeout_s``: one command's, unless the call says otherwise. ``cpu`` (cores) and
    ``memory_mb`` bound what its processes use; ``max_file_mb`` the largest file they may
    write; ``max_processes`` how many run at once. ``network``: off unless True, or unless
    ``cidr_allowlist`` names the address blocks it may reach. ``output_bytes``: how much of
    each command's stdout and stderr is kept (the rest is counted, not stored).
    """

    image: str | None = None
    packages: tuple[str, ...] = ()
    timeout_s: float = DEFAULT_TIMEOUT_S
    command_timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S
    cpu: float = 1.0
    memory_mb: int = DEFAULT_MEMORY_MB
    max_file_mb: int = DEFAULT_MAX_FILE_MB
    max_processes: int = DEFAULT_MAX_PROCESSES
    network: bool = False
    cidr_allowlist: tuple[str, ...] = ()
    output_bytes: int = DEFAULT_OUTPUT_BYTES
    workdir: str = "/sandbox"  # Modal's; a local sandbox works in a temp folder of its own

    def __post_init__(self) -> None:
        object.__setattr__(self, "packages", tuple(self.packages))
        object.__setattr__(self, "cidr_allowlist", tuple(self.cidr_allowlist))
        for name, low, high in (("timeout_s", 1, 24 * 3600), ("command_timeout_s", 0.1, 24 * 3600),
                                ("cpu", 0.125, 64), ("memory_mb", 64, 256 * 1024),
                                ("max_file_mb", 1, 1024 * 1024), ("max_processes", 1, 10_000),
                                ("output_bytes", 0, 64 * 1024 * 1024)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) \
                    or not low <= value <= high:
                raise UsageError(f"SandboxSettings.{name} must be a number from {low} to "
                                 f"{high}, got {value!r}",
                                 hint=f"pass {name}= within that range")
        if self.command_timeout_s > self.timeout_s:
            raise UsageError(f"SandboxSettings.command_timeout_s ({self.command_timeout_s:g}) "
                             f"is longer than the sandbox's timeout_s ({self.timeout_s:g})",
                             hint="a command cannot outlive its sandbox: lower "
                                  "command_timeout_s or raise timeout_s")
        for i, block in enumerate(self.cidr_allowlist):
            try:
                ipaddress.ip_network(block, strict=False)
            except ValueError:
                raise UsageError(f"SandboxSettings.cidr_allowlist[{i}] is not an address "
                                 f"block: {block!r}", hint="write blocks as 10.0.0.0/8 or "
                                 "203.0.113.7/32") from None
        if self.cidr_allowlist and self.network:
            raise UsageError("SandboxSettings.network=True and a cidr_allowlist together: "
                             "the list would allow nothing more",
                             hint="give network=True (all) or cidr_allowlist (only those)")

    @property
    def blocks_network(self) -> bool:
        """No network at all (the allowlist, if any, is the only way out)."""
        return not self.network and not self.cidr_allowlist

    def updated(self, **changes: Any) -> SandboxSettings:
        """These settings with ``changes`` (checked as a new one is)."""
        unknown = sorted(set(changes) - set(self.__dataclass_fields__))
        if unknown:
            raise UsageError(f"unknown sandbox setting(s): {', '.join(unknown)}",
                             hint="the settings are: " + ", ".join(self.__dataclass_fields__))
        return replace(self, **changes)

    def describe(self) -> dict[str, Any]:
        """The settings as `deploy --dry-run` and `/health` show them."""
        return {"image": self.image, "packages": list(self.packages),
                "timeout_s": self.timeout_s, "command_timeout_s": self.command_timeout_s,
                "cpu": self.cpu, "memory_mb": self.memory_mb, "max_file_mb": self.max_file_mb,
                "max_processes": self.max_processes,
                "network": "on" if self.network else (
                    "only " + ", ".join(self.cidr_allowlist) if self.cidr_allowlist else "off"),
                "output_bytes": self.output_bytes}


__all__ = ["SandboxSettings"]
