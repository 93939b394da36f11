"""Helpers for tests that run the CLI or a server as a real child process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

# Variables a developer's shell may hold that would change what a child process does.
_KIT_PREFIXES = ("ENVIRONMENT_API_KEY", "SYNTH_", "OTEL_")


def free_port() -> int:
    """A port free right now on 127.0.0.1 (for children that must be told their port)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def refused_port() -> Iterator[int]:
    """A port on 127.0.0.1 that refuses every connection while the block runs.

    The socket stays bound but never listens: a port merely free a moment ago can be
    taken by a server another test worker starts, and then it answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without the kit's own variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_KIT_PREFIXES)}
    env.update(extra)
    return env


def run_cli(cwd: Path, *args: str, timeout: float = 120, **env: str):
    """`synth-deploy ARGS` in ``cwd`` as a child process; returns the CompletedProcess."""
    return subprocess.run([sys.executable, "-m", "synth_deploy.cli", *args], cwd=cwd,
                          env=clean_env(**env), capture_output=True, text=True,
                          timeout=timeout)


def refused_in_process(cwd: Path, *args: str, **env: str):
    """`synth-deploy ARGS` in this process (typer's CliRunner) in ``cwd``, with the
    environment `run_cli` gives a child: for arguments refused before anything is served
    or reached, where a child process would cost an interpreter's start-up to say the same.
    Returns the click Result (``exit_code``, ``stdout``, ``stderr``, ``exception``)."""
    import contextlib

    from typer.testing import CliRunner

    from synth_deploy.cli import app

    unset: dict[str, str | None] = {k: None for k in os.environ if k.startswith(_KIT_PREFIXES)}
    with contextlib.chdir(cwd):
        return CliRunner().invoke(app, list(args), env={**unset, **env})


def wait_until_up(url: str, proc: subprocess.Popen, timeout_s: float = 20.0) -> None:
    """Poll ``url``/ until it answers; fail with the child's stderr if it exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited early: {proc.stderr.read()[-2000:]}")
        try:
            httpx.get(url + "/", timeout=1.0)
            return
        except httpx.HTTPError:
            time.sleep(0.05)
    raise AssertionError(f"server at {url} did not come up within {timeout_s:g}s")
