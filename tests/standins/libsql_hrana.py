"""A stand-in for a remote libSQL server (sqld / Turso): Hrana 3 over HTTP, JSON encoding.

Turso's edge and a self-hosted sqld cannot be reached from the test machine, so this is a
real HTTP server on 127.0.0.1 that speaks the protocol the ``libsql`` Python package
(0.1.11, libsql crate 0.9.22) uses for ``libsql.connect("http://..." , auth_token=...)``:

- ``POST /v3/pipeline``: ``{"baton", "requests": [...]}`` → ``{"baton", "base_url", "results"}``
  with stream requests ``execute``, ``batch``, ``sequence``, ``describe``, ``store_sql``,
  ``close_sql``, ``get_autocommit`` and ``close`` (HRANA_3_SPEC.md, "Hrana over HTTP");
- ``POST /v3/cursor``: a batch answered as newline-delimited JSON entries;
- ``GET /v3``, ``GET /health``: 200 when up.

Each baton is a stream bound to its own SQLite connection on a real file, so transactions
span pipeline requests exactly as on sqld. ``Authorization: Bearer <token>`` is checked when
a token is configured (401 otherwise). ``stall=True`` accepts requests and never answers, to
test client timeouts.

Run it as a process: ``python tests/standins/libsql_hrana.py --db F --token T [--port P]``
(prints ``listening http://127.0.0.1:P``); `start_hrana_process` does that with a timeout.
It must be a separate process for the ``libsql`` client: that client holds the GIL while it
waits for an answer, so a server thread in the same interpreter could never reply.
"""

from __future__ import annotations

import argparse
import base64
import json
import queue
import secrets
import sqlite3
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

STREAM_IDLE_S = 15.0
_READ_ACTIONS = {sqlite3.SQLITE_READ, sqlite3.SQLITE_SELECT, sqlite3.SQLITE_FUNCTION,
                 getattr(sqlite3, "SQLITE_RECURSIVE", 33)}


class _HranaError(Exception):
    def __init__(self, message: str, code: str = "SQLITE_ERROR"):
        super().__init__(message)
        self.message, self.code = message, code


def _decode(value: dict[str, Any]) -> Any:
    kind = value.get("type")
    if kind == "null":
        return None
    if kind == "integer":
        return int(value["value"])
    if kind == "float":
        return float(value["value"])
    if kind == "text":
        return value["value"]
    if kind == "blob":  # Hrana's base64 has no padding (the libsql client sends none)
        text = value["base64"]
        return base64.b64decode(text + "=" * (-len(text) % 4))
    raise _HranaError(f"unknown value type {kind!r}", "PROTOCOL")


def _encode(value: Any) -> dict[str, Any]:
    if value is None:
        return {"type": "null"}
    if isinstance(value, bool | int):
        return {"type": "integer", "value": str(int(value))}
    if isinstance(value, float):
        return {"type": "float", "value": value}
    if isinstance(value, bytes):
        return {"type": "blob", "base64": base64.b64encode(value).decode().rstrip("=")}
    return {"type": "text", "value": str(value)}


def _split_sql(script: str) -> list[str]:
    statements, current = [], ""
    for part in script.split(";"):
        current += part + ";"
        if sqlite3.complete_statement(current):
            if current.strip(" \n\t;"):
                statements.append(current)
            current = ""
    if current.strip(" \n\t;"):
        statements.append(current)
    return statements


class _Stream:
    """One Hrana stream: a SQLite connection plus the SQL texts stored on it."""

    def __init__(self, path: str):
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                                    timeout=10.0)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.sqls: dict[int, str] = {}
        self.lock = threading.Lock()
        self.last_used = time.monotonic()

    def close(self) -> None:
        try:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
        finally:
            self.conn.close()

    def _sql(self, obj: dict[str, Any]) -> str:
        if obj.get("sql") is not None:
            return obj["sql"]
        if obj.get("sql_id") is not None and obj["sql_id"] in self.sqls:
            return self.sqls[obj["sql_id"]]
        raise _HranaError("statement has neither sql nor a known sql_id", "PROTOCOL")

    def execute(self, stmt: dict[str, Any]) -> dict[str, Any]:
        sql = self._sql(stmt)
        params: Any = [_decode(v) for v in stmt.get("args") or []]
        if stmt.get("named_args"):
            params = {a["name"].lstrip(":@$"): _decode(a["value"]) for a in stmt["named_args"]}
        before = self.conn.total_changes
        try:
            cur = self.conn.execute(sql, params)
            rows = cur.fetchall() if stmt.get("want_rows", True) else []
        except sqlite3.Error as exc:
            raise _HranaError(str(exc), getattr(exc, "sqlite_errorname", "SQLITE_ERROR")) from exc
        cols = [{"name": d[0], "decltype": None} for d in cur.description or []]
        return {"cols": cols, "rows": [[_encode(v) for v in row] for row in rows],
                "affected_row_count": self.conn.total_changes - before,
                "last_insert_rowid": None if cur.lastrowid is None else str(cur.lastrowid),
                "rows_read": 0, "rows_written": 0, "query_duration_ms": 0.0}

    def _cond(self, cond: dict[str, Any] | None, ok: list[bool | None]) -> bool:
        if cond is None:
            return True
        kind = cond["type"]
        if kind == "ok":
            return ok[cond["step"]] is True
        if kind == "error":
            return ok[cond["step"]] is False
        if kind == "not":
            return not self._cond(cond["cond"], ok)
        if kind == "and":
            return all(self._cond(c, ok) for c in cond["conds"])
        if kind == "or":
            return any(self._cond(c, ok) for c in cond["conds"])
        if kind == "is_autocommit":
            return not self.conn.in_transaction
        raise _HranaError(f"unknown batch condition {kind!r}", "PROTOCOL")

    def batch(self, batch: dict[str, Any]) -> dict[str, Any]:
        results: list[Any] = []
        errors: list[Any] = []
        ok: list[bool | None] = []
        for step in batch.get("steps", []):
            if not self._cond(step.get("condition"), ok):
                results.append(None), errors.append(None), ok.append(None)
                continue
            try:
                results.append(self.execute(step["stmt"]))
                errors.append(None)
                ok.append(True)
            except _HranaError as exc:
                results.append(None)
                errors.append({"message": exc.message, "code": exc.code})
                ok.append(False)
        return {"step_results": results, "step_errors": errors}

    def describe(self, obj: dict[str, Any]) -> dict[str, Any]:
        sql = self._sql(obj)
        count = 0
        try:
            self.conn.execute("EXPLAIN " + sql).close()
        except sqlite3.ProgrammingError as exc:  # "... uses N, and there are 0 supplied."
            words = str(exc).replace(",", " ").split()
            count = int(words[words.index("uses") + 1]) if "uses" in words else 0
        except sqlite3.Error as exc:
            raise _HranaError(str(exc)) from exc
        actions: list[int] = []

        def authorizer(action: int, *_: Any) -> int:
            actions.append(action)
            return sqlite3.SQLITE_OK

        self.conn.set_authorizer(authorizer)
        try:
            self.conn.execute("EXPLAIN " + sql, [None] * count).close()
        except sqlite3.Error as exc:
            raise _HranaError(str(exc)) from exc
        finally:
            self.conn.set_authorizer(None)
        readonly = all(a in _READ_ACTIONS for a in actions)
        cols: list[dict[str, Any]] = []
        if readonly and sql.lstrip().upper().startswith(("SELECT", "WITH", "VALUES")):
            cur = self.conn.execute(f"SELECT * FROM ({sql.rstrip().rstrip(';')}) LIMIT 0",
                                    [None] * count)
            cols = [{"name": d[0], "decltype": None} for d in cur.description or []]
        return {"params": [{"name": None} for _ in range(count)], "cols": cols,
                "is_explain": sql.lstrip().upper().startswith("EXPLAIN"),
                "is_readonly": readonly}

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        kind = req.get("type")
        if kind == "execute":
            return {"type": "execute", "result": self.execute(req["stmt"])}
        if kind == "batch":
            return {"type": "batch", "result": self.batch(req["batch"])}
        if kind == "sequence":
            for statement in _split_sql(self._sql(req)):
                try:
                    self.conn.execute(statement)
                except sqlite3.Error as exc:
                    raise _HranaError(str(exc)) from exc
            return {"type": "sequence"}
        if kind == "describe":
            return {"type": "describe", "result": self.describe(req)}
        if kind == "store_sql":
            self.sqls[req["sql_id"]] = req["sql"]
            return {"type": "store_sql"}
        if kind == "close_sql":
            self.sqls.pop(req["sql_id"], None)
            return {"type": "close_sql"}
        if kind == "get_autocommit":
            return {"type": "get_autocommit", "is_autocommit": not self.conn.in_transaction}
        if kind == "close":
            return {"type": "close"}
        raise _HranaError(f"unknown stream request {kind!r}", "PROTOCOL")


class HranaServer:
    """The stand-in, served on a thread: ``with HranaServer(db, token=t) as s: s.url``."""

    def __init__(self, db_path: str, *, token: str | None = None, host: str = "127.0.0.1",
                 port: int = 0, stall: bool = False):
        self.db_path, self.token, self.stall = str(db_path), token, stall
        self.streams: dict[str, _Stream] = {}
        self.requests = 0
        self.unauthorized = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd = ThreadingHTTPServer((host, port), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> HranaServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True,
                                        name="hrana-standin")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(5.0)
        with self._lock:
            for stream in self.streams.values():
                stream.close()
            self.streams.clear()

    def __enter__(self) -> HranaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- protocol ------------------------------------------------------------------------

    def _take_stream(self, baton: str | None) -> _Stream:
        with self._lock:
            now = time.monotonic()
            for key, stream in list(self.streams.items()):
                if now - stream.last_used > STREAM_IDLE_S and not stream.lock.locked():
                    stream.close()
                    del self.streams[key]
            if baton is None:
                return _Stream(self.db_path)
            stream = self.streams.pop(baton, None)
        if stream is None:
            raise _HranaError("stream expired or baton invalid", "STREAM_EXPIRED")
        return stream

    def _give_back(self, stream: _Stream, closed: bool) -> str | None:
        if closed:
            stream.close()
            return None
        stream.last_used = time.monotonic()
        baton = secrets.token_urlsafe(18)
        with self._lock:
            self.streams[baton] = stream
        return baton

    def pipeline(self, body: dict[str, Any]) -> dict[str, Any]:
        stream = self._take_stream(body.get("baton"))
        results = []
        closed = False
        with stream.lock:
            for req in body.get("requests", []):
                try:
                    results.append({"type": "ok", "response": stream.handle(req)})
                except _HranaError as exc:
                    results.append({"type": "error",
                                    "error": {"message": exc.message, "code": exc.code}})
                closed = closed or req.get("type") == "close"
        return {"baton": self._give_back(stream, closed), "base_url": None, "results": results}

    def cursor(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        stream = self._take_stream(body.get("baton"))
        entries: list[dict[str, Any]] = []
        with stream.lock:
            result = stream.batch(body.get("batch") or {"steps": []})
        for i, (res, err) in enumerate(zip(result["step_results"], result["step_errors"],
                                           strict=True)):
            if err is not None:
                entries.append({"type": "step_error", "step": i, "error": err})
            elif res is not None:
                entries.append({"type": "step_begin", "step": i, "cols": res["cols"]})
                entries += [{"type": "row", "row": row} for row in res["rows"]]
                entries.append({"type": "step_end",
                                "affected_row_count": res["affected_row_count"],
                                "last_insert_rowid": res["last_insert_rowid"]})
        head = {"baton": self._give_back(stream, False), "base_url": None}
        return [head, *entries]

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out at once, as on sqld

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, payload: Any, *, ndjson: bool = False) -> None:
                if ndjson:
                    data = "".join(json.dumps(p) + "\n" for p in payload).encode()
                else:
                    data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                if server.token is None:
                    return True
                if self.headers.get("authorization") == f"Bearer {server.token}":
                    return True
                server.unauthorized += 1
                self._send(401, {"message": "Unauthorized: invalid or missing auth token",
                                 "code": "AUTH_TOKEN_INVALID"})
                return False

            def _stall(self) -> bool:
                if server.stall:
                    server._stopping.wait(60.0)
                    self.close_connection = True
                    return True
                return False

            def do_GET(self) -> None:
                if self._stall():
                    return
                if self.path in ("/health", "/version"):
                    self._send(200, {"status": "ok"})
                elif not self._authorized():
                    return
                elif self.path in ("/v2", "/v3"):
                    self._send(200, {})
                else:
                    self._send(404, {"message": f"no route {self.path}"})

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                if self._stall():
                    return
                server.requests += 1
                if not self._authorized():
                    return
                try:
                    body = json.loads(raw or b"{}")
                    if self.path in ("/v2/pipeline", "/v3/pipeline"):
                        self._send(200, server.pipeline(body))
                    elif self.path == "/v3/cursor":
                        self._send(200, server.cursor(body), ndjson=True)
                    else:
                        self._send(404, {"message": f"no route {self.path}"})
                except _HranaError as exc:
                    self._send(400, {"message": exc.message, "code": exc.code})
                except (ValueError, KeyError, TypeError) as exc:
                    self._send(400, {"message": f"bad request: {exc}", "code": "PROTOCOL"})

        return Handler


def start_hrana_process(db_path: str, *, token: str | None = None, stall: bool = False,
                        timeout_s: float = 15.0) -> tuple[subprocess.Popen[str], str]:
    """Run the stand-in as a child process; returns (process, url). Stop it with .kill()."""
    cmd = [sys.executable, __file__, "--db", str(db_path)]
    cmd += ["--token", token] if token else []
    cmd += ["--stall"] if stall else []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(proc.stdout.readline()), daemon=True).start()
    try:
        line = lines.get(timeout=timeout_s)
    except queue.Empty:
        proc.kill()
        proc.wait(5)
        raise RuntimeError("the libSQL stand-in did not start") from None
    if not line.startswith("listening "):
        proc.kill()
        proc.wait(5)
        raise RuntimeError(f"the libSQL stand-in failed: {proc.stderr.read()[-1000:]}")
    return proc, line.split()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--token")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--stall", action="store_true", help="accept requests, never answer")
    args = parser.parse_args()
    server = HranaServer(args.db, token=args.token, port=args.port, stall=args.stall)
    print(f"listening {server.url}", flush=True)
    try:
        server._httpd.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
