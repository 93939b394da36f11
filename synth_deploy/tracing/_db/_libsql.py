"""The remote backend: a libSQL server (Turso, sqld) through the ``libsql`` package.

The connection lives in a child process (see `_libsql_worker` for why); this object owns
that process: it starts it on first use, bounds every call with a timeout, kills it when a
call times out (the next call starts a fresh one), keeps its recent stderr for error
messages and reaps it on close and at interpreter exit.
"""

from __future__ import annotations

import atexit
import json
import queue
import subprocess
import sys
import threading
import weakref
from collections import deque
from collections.abc import Sequence
from typing import Any

from synth_deploy.env import redact, redact_userinfo
from synth_deploy.errors import TraceStoreError
from synth_deploy.tracing._db._libsql_worker import blob_json, from_json
from synth_deploy.tracing._errors import TraceDbAuthError, TraceDbUnreachableError

CONNECT_TIMEOUT_S = 15.0
CALL_TIMEOUT_S = 30.0
_NETWORK_WORDS = ("error trying to connect", "tcp connect", "connection refused", "dns error",
                  "connection reset", "connection closed", "timed out", "http error",
                  "hyper::Error", "broken pipe", "network unreachable")
_live: weakref.WeakSet[LibsqlBackend] = weakref.WeakSet()


class LibsqlBackend:
    """Statements against a remote libSQL server, run in an owned child process."""

    is_remote = True

    def __init__(self, url: str, token: str | None, *, display: str,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 call_timeout_s: float = CALL_TIMEOUT_S) -> None:
        self.url, self.display = url, display
        self._token = token
        self.connect_timeout_s, self.call_timeout_s = connect_timeout_s, call_timeout_s
        self._proc: subprocess.Popen[str] | None = None
        self._replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._stderr: deque[str] = deque(maxlen=20)
        self._lock = threading.Lock()
        _live.add(self)
        self._call({"op": "ping"}, self.connect_timeout_s)

    # -- child process --------------------------------------------------------------------

    def _start(self) -> None:
        proc = subprocess.Popen(
            [sys.executable, "-m", "synth_deploy.tracing._db._libsql_worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, bufsize=1)
        self._proc, self._replies = proc, queue.Queue()
        threading.Thread(target=_pump, args=(proc.stdout, self._replies, True),
                         daemon=True, name="libsql-worker-out").start()
        threading.Thread(target=_pump, args=(proc.stderr, self._stderr, False),
                         daemon=True, name="libsql-worker-err").start()
        # The token travels over the pipe, never in argv or the child's environment.
        self._send({"url": self.url, "token": self._token or ""})
        self._check(self._wait(self.connect_timeout_s, "start"))

    def _send(self, message: dict[str, Any]) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps(message, default=blob_json) + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass  # the child died; _wait reports it with its stderr

    def _wait(self, timeout_s: float, what: str) -> dict[str, Any]:
        try:
            reply = self._replies.get(timeout=timeout_s)
        except queue.Empty:
            self._kill()
            raise TraceDbUnreachableError(
                f"libSQL server at {self.display} did not answer within {timeout_s:g}s "
                f"({what})",
                hint="check the URL and that the server is up; nothing was written") from None
        if reply is None:
            tail = self._clean(" | ".join(self._stderr))[-400:]
            self._kill()
            raise TraceStoreError(f"the libSQL client process exited ({what})"
                                  + (f": {tail}" if tail else ""),
                                  hint="run `synth-deploy traces where` to diagnose")
        return reply

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
        if proc is not None:
            try:
                proc.wait(5.0)
            except subprocess.TimeoutExpired:
                pass

    def _clean(self, text: str) -> str:
        return redact_userinfo(redact(text, [self._token] if self._token else []))

    def _check(self, reply: dict[str, Any]) -> dict[str, Any]:
        if reply.get("ok"):
            return reply
        text = self._clean(str(reply.get("error", "unknown error")))
        if reply.get("kind") == "missing":
            self._kill()
            raise TraceStoreError(f"cannot reach {self.display}: {text}",
                                  hint="pip install 'libsql>=0.1.11' (synth-deploy[libsql])")
        lowered = text.lower()
        if "status=401" in lowered or "status=403" in lowered or "unauthorized" in lowered:
            raise TraceDbAuthError(f"libSQL server at {self.display} rejected the auth token",
                                   hint="check TURSO_AUTH_TOKEN (turso db tokens create <db>)")
        if any(word.lower() in lowered for word in _NETWORK_WORDS):
            self._kill()
            raise TraceDbUnreachableError(f"cannot reach libSQL server at {self.display}: {text}",
                                          hint="check the URL, the network and the server")
        raise TraceStoreError(f"libSQL server at {self.display}: {text}")

    def _call(self, message: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._start()
            self._send(message)
            return self._check(self._wait(timeout_s or self.call_timeout_s, message["op"]))

    # -- backend interface ----------------------------------------------------------------

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        reply = self._call({"op": "query", "sql": sql, "params": list(params)})
        cols = reply["cols"]
        return [dict(zip(cols, from_json(row), strict=True)) for row in reply["rows"]]

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """What `query` reads, as tuples in the statement's column order (for hot loops)."""
        reply = self._call({"op": "query", "sql": sql, "params": list(params)})
        return [from_json(row) for row in reply["rows"]]

    def run(self, statements: Sequence[tuple[str, Sequence[Any]]], *,
            transaction: bool = True) -> None:
        self._call({"op": "run", "transaction": transaction,
                    "statements": [[sql, list(params)] for sql, params in statements]})

    def insert_sessions(self, sessions: list[Any]) -> None:
        """Insert every row of ``sessions`` in one transaction (all or nothing)."""
        from synth_deploy.tracing._db._rows import insert_statements

        self.run(insert_statements(sessions))

    def close(self) -> None:
        with self._lock:
            proc = self._proc
            if proc is not None and proc.poll() is None:
                self._send({"op": "close"})
                try:
                    proc.wait(2.0)
                except subprocess.TimeoutExpired:
                    pass
            self._kill()
        _live.discard(self)


def _pump(stream: Any, sink: Any, parse: bool) -> None:
    for line in stream:
        if parse:
            try:
                sink.put(json.loads(line))
            except ValueError:
                continue
        else:
            sink.append(line.rstrip())
    if parse:
        sink.put(None)


@atexit.register
def _reap() -> None:
    for backend in list(_live):
        backend._kill()


__all__ = ["LibsqlBackend"]
