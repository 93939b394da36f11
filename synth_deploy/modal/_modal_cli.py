"""`ModalCLI`: Modal's command line (`modal deploy`, `modal serve`) as a child process we own.

One object owns the child: output is read on a thread into a bounded buffer (redacted before
anyone sees it), the wait has a hard deadline that a silent child cannot dodge, and a child
past its deadline is terminated, then killed. Tests pass ``command=`` to run a stand-in
``modal`` executable instead of the real one.
"""

from __future__ import annotations

import collections
import math
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from synth_deploy.env import redact
from synth_deploy.errors import DeployError

DEFAULT_DEPLOY_TIMEOUT_S = 600.0
MAX_OUTPUT_LINES = 400
TOKEN_FIX = "run `modal token new` (or set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET)"
# synth-deploy's own requirement on modal (pyproject.toml; a test keeps the two equal).
MODAL_REQUIREMENT = "modal>=1.0,<2"

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
_URL = re.compile(r"https?://[^\s\"'<>\]\[)]+")


class ModalCLIError(DeployError):
    """A `modal` command failed; ``output`` holds its last lines (secrets redacted)."""

    def __init__(self, message: str, *, hint: str | None = None,
                 output: Sequence[str] = ()) -> None:
        tail = "\n".join(f"    {line}" for line in list(output)[-25:])
        super().__init__(message + (f"\n  modal said:\n{tail}" if tail else ""), hint=hint)
        self.output = list(output)


def modal_missing(exc: ImportError) -> DeployError:
    """modal is a dependency of the kit, so this environment lost it: install modal alone
    (reinstalling the kit from PyPI would replace a checkout's version)."""
    return DeployError(f"the modal package cannot be imported ({exc})",
                       hint=f"modal is a dependency of synth-deploy that this environment "
                            f"lacks: pip install '{MODAL_REQUIREMENT}'")


def _cannot_run(program: str, exc: OSError) -> DeployError:
    return DeployError(f"cannot run {program}: {exc.strerror or exc}",
                       hint=f"check that {program} exists and is executable")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def find_web_url(lines: Iterable[str]) -> str | None:
    """The web function's URL in `modal deploy`/`modal serve` output, or None.

    modal 1.6 prints ``└── ✓ Created web function web`` and the URL on the next line; older
    versions print ``Created web function web => https://…``. The dashboard link ("View
    Deployment: https://modal.com/apps/…") is not the app's URL.
    """
    lines = [strip_ansi(line) for line in lines]
    for i, line in enumerate(lines):
        if "web function" in line or "web endpoint" in line:
            for candidate in lines[i:i + 3]:
                if "View Deployment" in candidate:
                    break
                match = _URL.search(candidate.split("web function", 1)[-1])
                if match:
                    return match.group(0).rstrip(".,")
    for line in lines:
        match = re.search(r"https://[\w.-]+\.modal\.run\S*", line)
        if match:
            return match.group(0).rstrip(".,")
    return None


@dataclass(frozen=True)
class CLIResult:
    """A finished `modal` run: its exit code and its output lines (redacted, ANSI stripped)."""

    returncode: int
    output: list[str]

    def error(self, what: str) -> ModalCLIError:
        """This failed run as an error that names the cause and the fix (``what``: the step,
        e.g. "modal deploy")."""
        text = "\n".join(self.output)
        if "Token missing" in text or "Could not authenticate client" in text:
            return ModalCLIError(f"{what}: Modal has no token", hint=TOKEN_FIX,
                                 output=self.output)
        if "Could not connect to the Modal server" in text or "ConnectionError" in text:
            return ModalCLIError(f"{what}: Modal is unreachable",
                                 hint="check the network (and https://status.modal.com), then "
                                      "retry", output=self.output)
        return ModalCLIError(f"{what} failed (exit {self.returncode})",
                             hint="see Modal's output above", output=self.output)


class ModalCLI:
    """The `modal` command line: ``ModalCLI()`` runs ``python -m modal`` from this Python."""

    def __init__(self, command: Sequence[str] | None = None) -> None:
        self.command = list(command) if command else [sys.executable, "-m", "modal"]

    def run(self, args: Sequence[str], *, env: Mapping[str, str], cwd: str | None = None,
            timeout_s: float | None = DEFAULT_DEPLOY_TIMEOUT_S, secrets: Sequence[str] = (),
            on_line: Callable[[str], None] | None = None,
            cancel: threading.Event | None = None) -> CLIResult:
        """Run ``modal ARGS`` to completion within ``timeout_s``; stream redacted lines.

        ``timeout_s=None`` only for `modal serve`, which runs until interrupted (Ctrl-C stops
        the child with us). ``cancel``: set from another thread, it stops the child (a run
        on a worker thread, which Ctrl-C does not reach) and raises `ModalCLIError`."""
        # Wide, plain output: rich must not wrap a long URL across lines.
        child_env = {**env, "COLUMNS": "1000", "PYTHONUNBUFFERED": "1",
                     "PYTHONIOENCODING": "utf-8", "TERM": "dumb", "NO_COLOR": "1"}
        try:
            proc = subprocess.Popen(
                [*self.command, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=child_env, cwd=cwd, start_new_session=True,
                text=True, encoding="utf-8", errors="replace", bufsize=1)
        except OSError as exc:
            raise _cannot_run(self.command[0], exc) from exc
        lines: collections.deque[str] = collections.deque(maxlen=MAX_OUTPUT_LINES)
        q: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                q.put(raw.rstrip("\r\n"))
            q.put(None)

        threading.Thread(target=pump, name="modal-cli-output", daemon=True).start()
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else math.inf)
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._stop(proc)
                    raise ModalCLIError(
                        f"`modal {' '.join(args[:1])}` did not finish within {timeout_s:g}s",
                        hint="is Modal reachable from here? (a token but no network makes "
                             "Modal retry for minutes) — retry, or raise --timeout",
                        output=list(lines))
                if cancel is not None and cancel.is_set():
                    self._stop(proc)
                    raise ModalCLIError(f"`modal {' '.join(args[:2])}` was cancelled",
                                        output=list(lines))
                try:
                    item = q.get(timeout=min(remaining, 0.2))
                except queue.Empty:
                    continue
                if item is None:
                    break
                line = redact(strip_ansi(item), secrets)
                lines.append(line)
                if on_line is not None:
                    on_line(line)
            left = deadline - time.monotonic()
            # Output closed: the child is exiting (unbounded runs get 30 s to do so).
            proc.wait(timeout=max(1.0, left if math.isfinite(left) else 30.0))
        except subprocess.TimeoutExpired:
            self._stop(proc)
            raise ModalCLIError(f"`modal {args[0]}` closed its output but did not exit",
                                output=list(lines)) from None
        except BaseException:
            self._stop(proc)
            raise
        return CLIResult(proc.returncode, list(lines))

    def run_foreground(self, args: Sequence[str], *, env: Mapping[str, str]) -> int:
        """Run ``modal ARGS`` attached to this terminal (for `modal serve`); its exit code.

        Ctrl-C reaches the child too (same process group); it is killed if it outlives us.
        """
        try:
            return subprocess.call([*self.command, *args], env=dict(env))
        except OSError as exc:
            raise _cannot_run(self.command[0], exc) from exc

    @staticmethod
    def _stop(proc: subprocess.Popen) -> None:
        if proc.poll() is not None:
            return
        # The child leads its own session: signal its group, i.e. the processes it started.
        for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=wait_s)
                return
            except subprocess.TimeoutExpired:
                continue


__all__ = ["CLIResult", "DEFAULT_DEPLOY_TIMEOUT_S", "MODAL_REQUIREMENT", "ModalCLI",
           "ModalCLIError", "TOKEN_FIX", "find_web_url", "modal_missing", "strip_ansi"]
