"""Finding and ending a sandbox's processes by what they carry, not by a pid kept somewhere.

A process belongs to a sandbox when it runs as the sandbox's own user (the local backend
gives each sandbox one when the server runs as root), or when it is in one of the sandbox's
process groups and its environment carries the sandbox's marker. Ending kills every match
with SIGKILL, again and again until none is left: a process forked between two passes is
found by the next, and a fork bomb under its process limit runs out of room to fork. Ending
returns once the killed are dead, not merely signalled.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

_PROC = Path("/proc")
MARKER_NAME = "SYNTH_DEPLOY_SANDBOX"  # in each sandbox process's environment: its sandbox id
_ROUNDS = 200
_SETTLE_S = 5.0  # how long the killed are waited for


def _stat(pid: str) -> tuple[str, int, int] | None:
    """(state, process group, start time in clock ticks) of ``pid``; None when it is gone."""
    try:
        text = (_PROC / pid / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    return fields[0], int(fields[2]), int(fields[19])


def _uid(pid: str) -> int | None:
    # /proc/PID belongs to the process's user once it has run a program as that user.
    try:
        return (_PROC / pid).stat().st_uid
    except OSError:
        return None


def _carries(pid: str, marker: bytes) -> bool:
    try:
        return marker in (_PROC / pid / "environ").read_bytes().split(b"\0")
    except OSError:
        return False


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot): with the pid, who a process is, as a
    recycled pid is not."""
    found = _stat(str(pid))
    return None if found is None else found[2]


def alive(pid: int, started: int | None) -> bool:
    """Whether the process ``pid`` that started at ``started`` is still running."""
    if not _PROC.is_dir():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    found = _stat(str(pid))
    return found is not None and found[0] != "Z" and (started is None or found[2] == started)


def members(sandbox_id: str, *, uid: int | None, groups: Iterable[int]) -> Iterator[int]:
    """The live processes of the sandbox ``sandbox_id`` (zombies left out: they are dead)."""
    groups = set(groups)
    marker = f"{MARKER_NAME}={sandbox_id}".encode()
    me = os.getpid()
    for name in os.listdir(_PROC):
        if not name.isdigit() or int(name) == me:
            continue
        found = _stat(name)
        if found is None or found[0] == "Z":
            continue
        if uid is not None and _uid(name) == uid:
            yield int(name)
        elif found[1] in groups and _carries(name, marker):
            yield int(name)


def end_processes(sandbox_id: str, *, uid: int | None, groups: Iterable[int]) -> int:
    """SIGKILL every process of the sandbox until none is left; how many were killed."""
    groups = list(groups)
    if not _PROC.is_dir():  # no /proc (macOS): its process groups are all that can be named
        for group in groups:
            try:
                os.killpg(group, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        return 0
    killed: set[int] = set()
    rounds = 0
    settled_by = time.monotonic() + _SETTLE_S
    while rounds < _ROUNDS:
        found = list(members(sandbox_id, uid=uid, groups=groups))
        fresh = [pid for pid in found if pid not in killed]
        if not found:
            break
        if not fresh:
            # SIGKILL lands when the process next runs, later on a loaded machine: wait for
            # it, so that a sandbox said ended has no process left (bounded: a process in
            # an uninterruptible wait dies when that wait ends).
            if time.monotonic() > settled_by:
                break
            time.sleep(0.005)
            continue
        rounds += 1
        for pid in fresh:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        killed.update(fresh)
    return len(killed)

__all__ = ["MARKER_NAME", "alive", "end_processes", "members", "start_time"]
