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
    (SIGTERM, then SIGKILL after 5 s)."""
    pids = state / "pids"
    for pid in (int(p) for p in pids.read_text().split()) if pids.exists() else ():
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        for _ in range(100):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
