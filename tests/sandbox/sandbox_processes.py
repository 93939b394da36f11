"""What a test sees of a local sandbox's processes, read from /proc as `ps` would."""

from __future__ import annotations

import os
import time
from pathlib import Path

MARKER = "SYNTH_DEPLOY_SANDBOX"


def _live(pid: str) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def sandbox_processes(sandbox_id: str | None = None, *, uids: set[int] | None = None
                      ) -> list[int]:
    """Live processes carrying a sandbox marker (``sandbox_id``'s, or any sandbox's), or
    running as one of ``uids``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or not _live(pid):
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            uid = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            continue
        marked = any(e.startswith(f"{MARKER}=".encode()) and (
            sandbox_id is None or e == f"{MARKER}={sandbox_id}".encode()) for e in environ)
        if marked or (uids and uid in uids):
            found.append(int(pid))
    return found


def local_leftovers(box) -> list[int]:
    return sandbox_processes(box.id)


def wait_for(condition, timeout_s: float = 20.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
