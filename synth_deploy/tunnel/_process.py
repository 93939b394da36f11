"""One cloudflared child process, owned by one object.

`TunnelProcess` holds the ``Popen``, a bounded ring of (redacted) log lines filled by a reader
thread, and an orphan guard so the child dies with its parent even on SIGKILL:

- Linux: ``PR_SET_PDEATHSIG`` set between fork and exec. The signal fires when the *thread*
  that spawned the child exits, so spawn from a thread that lives as long as the child (the
  `Tunnel` supervisor does).
- other POSIX systems: a tiny watchdog process that polls for the parent and kills the child.

The child gets its own session so a terminal's Ctrl+C reaches only us: the CLI decides how to
shut down, and the supervisor does not mistake a Ctrl+C'd cloudflared for a crash. Live
children are stopped by an ``atexit`` hook.
"""

from __future__ import annotations

import atexit
import collections
import os
import signal
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence

from synth_deploy.env import redact
from synth_deploy.errors import TunnelError

DEFAULT_LOG_LINES = 200
ORPHAN_GUARDS = ("auto", "pdeathsig", "watchdog", "none")
_PR_SET_PDEATHSIG = 1
_LIVE: weakref.WeakSet[TunnelProcess] = weakref.WeakSet()

# Polls for the parent every 0.25 s; when it is gone, SIGTERM then SIGKILL the child.
_WATCHDOG = """
import os, signal, sys, time
parent, child = int(sys.argv[1]), int(sys.argv[2])
def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
while alive(child):
    if os.getppid() != parent:
        os.kill(child, signal.SIGTERM)
        for _ in range(20):
            time.sleep(0.1)
            if not alive(child):
                break
        else:
            os.kill(child, signal.SIGKILL)
        break
    time.sleep(0.25)
"""


class TunnelProcess:
    """A child process with a bounded log buffer and an orphan guard::

        with TunnelProcess(["cloudflared", "tunnel", ...], secrets=[token]) as proc:
            proc.logs()

    ``env`` holds variables set for the child on top of the environment it inherits from
    this process; ``secrets`` are masked in its logs and its displayed command line.
    """

    def __init__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                 secrets: Sequence[str] = (), log_lines: int = DEFAULT_LOG_LINES,
                 orphan_guard: str = "auto",
                 on_line: Callable[[str], None] | None = None) -> None:
        if orphan_guard not in ORPHAN_GUARDS:
            raise ValueError(f"orphan_guard must be {'|'.join(ORPHAN_GUARDS)}, "
                             f"got {orphan_guard!r}")
        self.argv = list(argv)
        self.env = dict(env or {})
        self._secrets = [s for s in secrets if s]
        self._lines: collections.deque[str] = collections.deque(maxlen=log_lines)
        self._lock = threading.Lock()
        self._stop_lock = threading.Lock()
        self._on_line = on_line
        self._guard = orphan_guard
        self._popen: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._drained = False  # an exited child's output has all been read (or given up on)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> TunnelProcess:
        if self._popen is not None:
            raise RuntimeError("TunnelProcess already started")
        guard = self._resolved_guard()
        kwargs: dict = {}
        if os.name == "posix":
            kwargs["start_new_session"] = True
            if guard == "pdeathsig":
                kwargs["preexec_fn"] = _pdeathsig_preexec()
        else:
            kwargs["creationflags"] = getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)
        # The one place the child's environment is built: inherited, plus what we were given.
        child_env = {**os.environ, **self.env} if self.env else None
        try:
            self._popen = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, env=child_env, close_fds=True, **kwargs)
        except OSError as exc:
            raise TunnelError(f"cannot start {self.display_argv()[0]}: {exc.strerror or exc}",
                              hint="check that the cloudflared binary is executable") from exc
        if guard == "watchdog":
            self._watchdog = subprocess.Popen(
                [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(self._popen.pid)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)
        self._reader = threading.Thread(target=self._read, name=f"cloudflared-log-{self.pid}",
                                        daemon=True)
        self._reader.start()
        _LIVE.add(self)
        return self

    def stop(self, timeout_s: float = 5.0) -> int | None:
        """SIGTERM, wait up to ``timeout_s``, then SIGKILL; returns the exit code.

        Safe from several threads at once (the caller and the tunnel's supervisor both stop
        it): one SIGTERM is sent and the others wait for its outcome. cloudflared stops
        listening for signals once its graceful shutdown begins, so a second SIGTERM would
        kill it on the spot (exit -15) instead of letting it drain.
        """
        with self._stop_lock:
            return self._stop(timeout_s)

    def _stop(self, timeout_s: float) -> int | None:
        proc = self._popen
        if proc is None:
            return None
        if proc.poll() is None:
            try:
                proc.terminate()
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5.0)
            except ProcessLookupError:
                pass
        if self._watchdog is not None and self._watchdog.poll() is None:
            self._watchdog.kill()
            self._watchdog.wait(2.0)
        if self._reader is not None:
            self._reader.join(2.0)
        _LIVE.discard(self)
        return proc.returncode

    def __enter__(self) -> TunnelProcess:
        return self.start() if self._popen is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- state -----------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    @property
    def returncode(self) -> int | None:
        return self._popen.poll() if self._popen is not None else None

    @property
    def alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def wait(self, timeout_s: float) -> int | None:
        """Wait up to ``timeout_s`` for the child to exit; its exit code, or None if running."""
        if self._popen is None:
            return None
        try:
            return self._popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def logs(self, last: int | None = None) -> list[str]:
        """The most recent log lines (secrets already redacted), oldest first. Once the child
        has exited, they include its last lines: asked right after the exit, the reader may
        not have taken them from the pipe yet (so an error said nothing was logged)."""
        reader = self._reader
        if not self._drained and self.returncode is not None and reader is not None \
                and reader is not threading.current_thread():  # (an ``on_line`` asking)
            reader.join(2.0)  # at EOF at once, unless a grandchild holds the pipe
            self._drained = True
        with self._lock:
            lines = list(self._lines)
        return lines[-last:] if last else lines

    def display_argv(self) -> list[str]:
        """The command line with secrets masked, safe to print."""
        return [redact(arg, self._secrets) for arg in self.argv]

    def __repr__(self) -> str:
        state = "running" if self.alive else f"exited {self.returncode}"
        return f"TunnelProcess(pid={self.pid}, {state}, argv={self.display_argv()!r})"

    # -- internals -------------------------------------------------------------------------

    def _resolved_guard(self) -> str:
        if self._guard != "auto":
            return self._guard
        if sys.platform.startswith("linux"):
            return "pdeathsig"
        return "watchdog" if os.name == "posix" else "none"

    def _read(self) -> None:
        assert self._popen is not None and self._popen.stdout is not None
        for raw in iter(self._popen.stdout.readline, b""):
            line = redact(raw.decode("utf-8", "replace").rstrip(), self._secrets)
            with self._lock:
                self._lines.append(line)
            if self._on_line is not None:
                self._on_line(line)
        self._popen.stdout.close()


def _pdeathsig_preexec() -> Callable[[], None]:
    import ctypes

    # Resolve libc in the parent: the child, between fork and exec, only makes the call.
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


@atexit.register
def _reap() -> None:
    for proc in list(_LIVE):
        proc.stop(timeout_s=3.0)


__all__ = ["DEFAULT_LOG_LINES", "ORPHAN_GUARDS", "TunnelProcess"]
