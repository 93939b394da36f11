"""What uvicorn's protocols log about a client, cut to what an operator needs.

uvicorn logs a request's path with its whole query string (each access-log line, and each
WebSocket handshake even with the access log off) and a warning for each malformed request.
A client controls all of it, key or no key: a handshake with a 1 MB query is 1 MB of log, a key
put in the query (``?api_key=...``) is printed, and malformed requests are a line each. Each
protocol of the kit's (`_connections`) logs through `ClientLog` instead:

- a path is logged without its query (shown as ``?…``) and cut at `PATH_SHOWN` characters;
- a WebSocket handshake line is an access-log line, and so are websockets' own "connection
  open" and "connection closed" of each session: logged only when the access log is on;
- a warning (a malformed request, an unsupported upgrade) is one line per `WARN_EVERY_S` for
  each kind, which says how many like it were left out.
"""

from __future__ import annotations

import logging
import time
from typing import Any

PATH_SHOWN = 200
WARN_EVERY_S = 10.0
_HANDSHAKE = '%s - "WebSocket %s"'
_SESSION_LINES = frozenset({"connection open", "connection closed"})  # websockets' own
# By warning: when it was last logged, and how many like it were left out since.
_warned: dict[str, list[float]] = {}


def shown_path(path: Any) -> Any:
    """``path`` as a log line shows it: no query, at most `PATH_SHOWN` characters."""
    if not isinstance(path, str):
        return path
    path, query, _ = path.partition("?")
    if len(path) > PATH_SHOWN:
        path = path[:PATH_SHOWN] + "…"
    return path + ("?…" if query else "")


class ClientLog:
    """A uvicorn protocol's logger (``uvicorn.error`` or ``uvicorn.access``), with the rules
    above; ``handshakes``: log WebSocket handshakes (the access log is on)."""

    def __init__(self, logger: logging.Logger, *, handshakes: bool) -> None:
        self._logger = logger
        self._handshakes = handshakes

    def info(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(msg, str) and msg.startswith(_HANDSHAKE):  # (client, path, status)
            if not self._handshakes:
                return
            args = (args[0], shown_path(args[1]), *args[2:])
        elif isinstance(msg, str) and msg in _SESSION_LINES and not self._handshakes:
            return
        elif isinstance(msg, str) and msg.startswith('%s - "%s %s HTTP/%s"'):  # access
            args = (*args[:2], shown_path(args[2]), *args[3:])
        self._logger.info(msg, *args, **kwargs)

    def warning(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        key = str(msg)
        now = time.monotonic()
        seen = _warned.setdefault(key, [float("-inf"), 0])
        if now - seen[0] < WARN_EVERY_S:
            seen[1] += 1
            return
        if seen[1]:
            msg = f"{msg} ({int(seen[1])} more like it since the last such line)"
        seen[0], seen[1] = now, 0
        self._logger.warning(msg, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # level, isEnabledFor, error, exception...
        return getattr(self._logger, name)


__all__ = ["ClientLog", "PATH_SHOWN", "WARN_EVERY_S", "shown_path"]
