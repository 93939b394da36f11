"""How tests run the stand-in `modal` CLI (modal_cli.py): the command `--modal-cli` takes."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

STANDIN = Path(__file__).with_name("modal_cli.py")
COMMAND = f"{sys.executable} {STANDIN}"


def stop_containers(state: Path) -> None:
    """Stop, by pid, every "container" the stand-in started with ``state`` as its state dir
    (SIGTERM to each at once, as Modal stops an app's containers; SIGKILL to any still
    running after 5 s)."""
    pids = state / "pids"
    running = []
    for pid in (int(p) for p in pids.read_text().split()) if pids.exists() else ():
        try:
            os.kill(pid, signal.SIGTERM)
            running.append(pid)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + 5
    while running and time.monotonic() < deadline:
        running = [pid for pid in running if alive(pid)]
        time.sleep(0.05)
    for pid in running:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def alive(pid: int) -> bool:
    """Whether a process ``pid`` runs (or is a zombie not yet reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
