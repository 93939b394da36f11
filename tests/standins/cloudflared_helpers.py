"""Driving the cloudflared stand-in (tests/standins/cloudflared) from tests."""

from __future__ import annotations

import base64
import json
import os
import secrets
import signal
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

STANDIN = Path(__file__).with_name("cloudflared")
# Run it with this interpreter: the shebang's python3 may be another one.
COMMAND = [sys.executable, str(STANDIN)]


def make_token() -> str:
    """A token shaped like Cloudflare's: base64 of {"a": account, "t": tunnel, "s": secret}."""
    payload = {"a": secrets.token_hex(16), "t": "6ff42ae2-765d-4adf-8112-31c55c1551ef",
               "s": base64.b64encode(secrets.token_bytes(32)).decode()}
    return base64.b64encode(json.dumps(payload).encode()).decode()


class StandinState:
    """What each launch of the stand-in wrote to its state directory."""

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)

    def env(self, mode: str = "ok", **extra: str) -> dict[str, str]:
        """The environment that makes the stand-in behave as ``mode`` and report here."""
        values = {"STANDIN_CLOUDFLARED_MODE": mode, "STANDIN_CLOUDFLARED_STATE_DIR": str(self.dir)}
        values.update({f"STANDIN_CLOUDFLARED_{k.upper()}": str(v) for k, v in extra.items()})
        return values

    def launches(self) -> list[dict]:
        found = []
        for path in sorted(self.dir.glob("launch-*.json"),
                           key=lambda p: int(p.stem.split("-")[1])):
            try:
                found.append(json.loads(path.read_text()))
            except (ValueError, OSError):  # claimed but not yet written
                continue
        return found

    def pids(self) -> list[int]:
        return [launch["pid"] for launch in self.launches()]

    def crash(self, launch: int = 1) -> None:
        """Crash launch ``launch`` (counted from 1), started in mode ``dies``, now."""
        os.kill(self.launches()[launch - 1]["pid"], signal.SIGUSR1)

    def resolve(self, public_url: str) -> str:
        """The test seam for `Tunnel(resolve=...)`: public hostname → the stand-in's forwarder.

        A hostname no launch reported yet maps to a closed loopback port, as an unpropagated
        DNS name maps to nothing.
        """
        host = urlsplit(public_url).hostname
        for launch in reversed(self.launches()):
            if launch.get("hostname") == host and launch.get("forward_url"):
                return launch["forward_url"]
        return "http://127.0.0.1:9"


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone: it runs nothing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def wait_gone(pids: list[int], timeout_s: float = 5.0) -> list[int]:
    """Wait until no pid runs; returns those still running at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [pid for pid in pids if pid_alive(pid)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)
