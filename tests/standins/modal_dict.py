"""A stand-in for Modal's Dict service: a process of its own holding named Dicts, and the
``Dict`` client a stand-in container's ``modal`` offers.

    python modal_dict.py PORT_FILE [IDLE_S]       # serves on 127.0.0.1, its port in PORT_FILE

Modal's documented semantics (modal 1.6's ``modal.Dict``), played over loopback HTTP:

- ``Dict.from_name(name, create_if_missing=True)``; without ``create_if_missing`` a Dict
  never created is an error (``NotFoundError``), as Modal's.
- ``put(key, value, skip_if_exists=False) -> bool``: with ``skip_if_exists`` the entry is
  added only when the key is absent, atomically in the service (one lock), and the answer
  says whether it was (``created``).
- ``get(key, default=None)``, ``contains(key)``, ``pop(key[, default])`` (KeyError when
  absent and no default), ``len()``.
- An entry expires ``IDLE_S`` after its last read or write (Modal: 7 days).

Keys and values cross as JSON (Modal pickles them; the kit puts strings, numbers and plain
dicts, which come back equal either way).
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SEVEN_DAYS_S = 7 * 86_400.0
_NO_DEFAULT = object()


class NotFoundError(Exception):
    """What Modal raises for a Dict looked up by a name nobody created."""


class _Service:
    def __init__(self, idle_s: float) -> None:
        self.idle_s = idle_s
        self.lock = threading.Lock()
        self.dicts: dict[str, dict[str, tuple[Any, float]]] = {}

    def _live(self, name: str, key: str, now: float) -> tuple[Any, float] | None:
        entries = self.dicts[name]
        entry = entries.get(key)
        if entry is not None and now - entry[1] > self.idle_s:
            del entries[key]  # expired: as if never there
            return None
        return entry

    def call(self, op: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
        now = time.monotonic()
        with self.lock:
            if op == "from_name":
                if name not in self.dicts:
                    if not args.get("create_if_missing"):
                        return {"error": "not_found"}
                    self.dicts[name] = {}
                return {}
            if name not in self.dicts:
                return {"error": "not_found"}
            entries = self.dicts[name]
            key = args.get("key")
            if op == "put":
                if args.get("skip_if_exists") and self._live(name, key, now) is not None:
                    return {"created": False}
                entries[key] = (args["value"], now)
                return {"created": True}
            if op in ("get", "contains"):
                entry = self._live(name, key, now)
                if entry is None:
                    return {"found": False}
                entries[key] = (entry[0], now)  # a read keeps it alive
                return {"found": True, "value": entry[0]}
            if op == "pop":
                entry = self._live(name, key, now)
                entries.pop(key, None)
                return {"found": entry is not None, "value": None if entry is None else entry[0]}
            if op == "len":
                for k in list(entries):
                    self._live(name, k, now)
                return {"len": len(entries)}
        return {"error": f"unknown operation {op}"}


def serve(port_file: str, idle_s: float) -> None:
    service = _Service(idle_s)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            _, op, name = self.path.split("/", 2)
            args = json.loads(self.rfile.read(int(self.headers["content-length"])) or b"{}")
            body = json.dumps(service.call(op, name, args)).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    tmp = Path(port_file + ".tmp")
    tmp.write_text(str(server.server_address[1]))
    tmp.rename(port_file)
    server.serve_forever()


class Dict:
    """What `modal.Dict` offers a container, against the service at ``url``."""

    url = ""  # the service's, set by `install`

    def __init__(self, name: str) -> None:
        self.name = name
        self._local = threading.local()

    @classmethod
    def from_name(cls, name: str, *, create_if_missing: bool = False, **_: object) -> Dict:
        d = cls(name)
        if d._call("from_name", create_if_missing=create_if_missing).get("error"):
            raise NotFoundError(f"Dict '{name}' not found")
        return d

    def _call(self, op: str, **args: Any) -> dict[str, Any]:
        host, port = self.url.removeprefix("http://").split(":")
        for attempt in (0, 1):  # a kept-alive connection the service closed: once more
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = http.client.HTTPConnection(host, int(port), timeout=30)
            try:
                conn.request("POST", f"/{op}/{self.name}", body=json.dumps(args),
                             headers={"content-type": "application/json"})
                answer = json.loads(conn.getresponse().read())
                break
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
        if answer.get("error") == "not_found":
            raise NotFoundError(f"Dict '{self.name}' not found")
        return answer

    def put(self, key: Any, value: Any, *, skip_if_exists: bool = False) -> bool:
        return self._call("put", key=key, value=value, skip_if_exists=skip_if_exists)["created"]

    def get(self, key: Any, default: Any = None) -> Any:
        answer = self._call("get", key=key)
        return answer["value"] if answer["found"] else default

    def contains(self, key: Any) -> bool:
        return self._call("contains", key=key)["found"]

    def pop(self, key: Any, default: Any = _NO_DEFAULT) -> Any:
        answer = self._call("pop", key=key)
        if answer["found"]:
            return answer["value"]
        if default is _NO_DEFAULT:
            raise KeyError(key)
        return default

    def len(self) -> int:
        return self._call("len")["len"]

    def __getitem__(self, key: Any) -> Any:
        answer = self._call("get", key=key)
        if not answer["found"]:
            raise KeyError(key)
        return answer["value"]

    def __setitem__(self, key: Any, value: Any) -> None:
        self.put(key, value)


def install(client: Any, url: str) -> None:
    """Give the stand-in ``modal`` module ``client`` a Dict served at ``url``."""
    Dict.url = url
    client.Dict = Dict
    # Added to what is there: another stand-in (the Sandboxes') puts its errors there too.
    if getattr(client, "exception", None) is None:
        client.exception = type(sys)("modal.exception")
    client.exception.NotFoundError = NotFoundError


if __name__ == "__main__":
    serve(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else SEVEN_DAYS_S)
