"""Modal's API server as far as the network goes, for tests that must never reach Modal.

`ModalAPIStandin("up")` accepts TCP connections on 127.0.0.1 (and closes them): the API is
reachable. ``"down"``: nothing listens (connection refused, as with no route). ``"dropping"``:
a listener whose backlog is full, so the kernel drops every SYN and a connect hangs until its
timeout, as on a network that loses packets. Point MODAL_SERVER_URL at ``.url``.
"""

from __future__ import annotations

import socket
import threading


class ModalAPIStandin:
    def __init__(self, mode: str = "up") -> None:
        if mode not in ("up", "down", "dropping"):
            raise ValueError(f"unknown mode {mode!r}")
        self.mode = mode
        self._sockets: list[socket.socket] = []
        self._stop = threading.Event()
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        self.port = listener.getsockname()[1]
        if mode == "down":
            listener.close()  # the port was free a moment ago and nothing listens on it now
            return
        self._sockets.append(listener)
        if mode == "dropping":
            listener.listen(0)
            filler = socket.socket()  # one pending connection fills a backlog of 0
            filler.connect(("127.0.0.1", self.port))
            self._sockets.append(filler)
            return
        listener.listen(16)
        listener.settimeout(0.1)
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self, listener: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = listener.accept()
            except (TimeoutError, OSError):
                continue
            conn.close()

    def close(self) -> None:
        self._stop.set()
        for sock in self._sockets:
            sock.close()

    def __enter__(self) -> ModalAPIStandin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
