"""Child process that owns the ``libsql`` connection to a remote libSQL server.

``libsql`` 0.1.11 keeps the GIL while it waits on the network and has no request timeout,
so calling it inside a server would freeze every coroutine for each round trip, and a dead
server would hang it for good. Here it runs alone; the parent (`_libsql.LibsqlBackend`)
talks JSON lines over stdin/stdout, bounds every call with a timeout and kills this process
when one expires.

First line in: ``{"url", "token"}``. Then one request a line:
``{"op": "ping"}``, ``{"op": "query", "sql", "params"}``,
``{"op": "run", "statements": [[sql, params], ...], "transaction": bool}``,
``{"op": "close"}``; each answered by ``{"ok": true, ...}`` or ``{"ok": false, "error"}``.
A BLOB (a parameter or a value read) crosses as ``{"$blob": base64}``.
"""

from __future__ import annotations

import base64
import json
import sys
from typing import Any

BLOB = "$blob"


def blob_json(value: Any) -> Any:
    """``json.dumps``'s ``default``: bytes as ``{"$blob": base64}``."""
    if isinstance(value, bytes | bytearray | memoryview):
        return {BLOB: base64.b64encode(bytes(value)).decode()}
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def from_json(values: Any) -> tuple[Any, ...]:
    """A row or parameter list read back: ``{"$blob": ...}`` as bytes."""
    return tuple(base64.b64decode(v[BLOB]) if isinstance(v, dict) and BLOB in v else v
                 for v in values or ())


def _reply(out: Any, payload: dict[str, Any]) -> None:
    out.write(json.dumps(payload, default=blob_json) + "\n")
    out.flush()


def _serve(conn: Any, request: dict[str, Any]) -> dict[str, Any]:
    op = request.get("op")
    if op == "ping":
        conn.execute("SELECT 1").fetchall()
        return {"ok": True}
    if op == "query":
        cur = conn.execute(request["sql"], from_json(request.get("params")))
        rows = cur.fetchall()
        cols = [d[0] for d in cur.description or ()]
        return {"ok": True, "cols": cols, "rows": [list(r) for r in rows]}
    if op == "run":
        transaction = request.get("transaction", True)
        if transaction:
            conn.execute("BEGIN IMMEDIATE")
        try:
            for sql, params in request["statements"]:
                conn.execute(sql, from_json(params))
            if transaction:
                conn.execute("COMMIT")
        except Exception:
            if transaction:
                try:
                    conn.execute("ROLLBACK")
                except Exception:  # the stream may already be gone; the server rolls back
                    pass
            raise
        return {"ok": True}
    return {"ok": False, "error": f"unknown op {op!r}"}


def main() -> None:
    out = sys.stdout
    sys.stdout = sys.stderr  # nothing but protocol lines may reach the parent's pipe
    config = json.loads(sys.stdin.readline() or "{}")
    try:
        import libsql
    except ImportError:
        _reply(out, {"ok": False, "error": "the libsql package is not installed",
                     "kind": "missing"})
        return
    try:
        conn = libsql.connect(config["url"], auth_token=config.get("token") or "",
                              isolation_level=None)
    except Exception as exc:
        _reply(out, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        return
    _reply(out, {"ok": True, "ready": True})
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("op") == "close":
            _reply(out, {"ok": True})
            break
        try:
            _reply(out, _serve(conn, request))
        except Exception as exc:
            _reply(out, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})


if __name__ == "__main__":
    main()
