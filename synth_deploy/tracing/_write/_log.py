"""The session log: how a store whose readers are elsewhere keeps each session.

A Modal container's sessions are read at home (`traces pull`), from the copies its
`VolumeSnapshots` puts on the app's Volume; nothing in the container reads them. So they
need no rows there, no writer child and no commit: the server appends each session whole to
a log file beside the store (`TraceDbSetting.session_log`), in one ``os.write`` from the
thread that finished it: the session as msgpack (`_codec`, the cheapest encoding measured
for that thread), and what its rollout's facts say of it (keys masked first, so no secret
reaches the file).

    <store>.sessions/<n>.log      log file n (1, 2, ...): `MAGIC`, then records appended

A record is a header (the lengths of the session id, the body and the rollout description,
`NO_ROLLOUT` for none; little-endian) and those bytes. `MAGIC` and a run of whole records is
a log file too: the copier puts the records new since its last copy in such a file on the
Volume, as they are (`copy_session_log`: no parsing, no SQL), and `merge_trace_file` decodes
it at home (`decode_session`).

Once the write returns, the record is in the file: the process may be killed at any moment
after and it is read (like a commit of the store, it is not fsynced: an OS crash may lose
it, and a container's disk does not outlive its container anyway). A write that fails is
cut off, so no part of a record is followed by whole ones. A file is followed by file n + 1
once it holds `ROTATE_BYTES`, and no record goes to it after that: a reader that sees file
n + 1 knows file n is whole, and may delete it once its records are safe elsewhere
(`drop_copied_logs`). The newest file may be read while a record is being written: a
reader takes whole records only (`read_log_span`), and the rest next time.

One process writes a store's log (a served app's; a Modal container runs one).
"""

from __future__ import annotations

import logging
import os
import re
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from synth_deploy.errors import TraceStoreError
from synth_deploy.tracing._errors import TraceFormatError
from synth_deploy.tracing._rollout_facts import RolloutFacts, rollout_description
from synth_deploy.tracing._session import SessionTrace
from synth_deploy.tracing._write._codec import encode, encode_session

logger = logging.getLogger("synth_deploy.tracing")

MAGIC = b"synth-deploy session log 1\n"
_HEAD = struct.Struct("<III")
NO_ROLLOUT = 0xFFFFFFFF
# A file is followed by the next at this size: what a copier keeps on disk past what it
# copied is at most one file.
ROTATE_BYTES = 64 << 20
_FILE = re.compile(r"^(\d+)\.log$")

# (session id, body, rollout description or None), each encoded by `_codec`.
Record = tuple[str, bytes, bytes | None]


def session_log_folder(store: str | os.PathLike[str]) -> Path:
    """Where the session log of the store at ``store`` is kept."""
    path = Path(store)
    return path.with_name(path.name + ".sessions")


def session_log_files(store: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """The log files of the store at ``store``: (number, path) each, oldest first."""
    folder = session_log_folder(store)
    if not folder.is_dir():
        return []
    return sorted((int(m[1]), path) for path in folder.iterdir()
                  if (m := _FILE.match(path.name)))


@dataclass(frozen=True)
class LogSpan:
    """What `read_log_span` found: the bytes of the whole records from where it started,
    where the next read starts (past the last whole one), and the file's size when read."""

    data: bytes
    end: int
    size: int


@dataclass(frozen=True)
class LogRead:
    """What `read_session_log` found: the whole records from where it started, where the
    next read starts, and the file's size when read."""

    records: list[Record]
    end: int
    size: int


def is_session_log(path: str | os.PathLike[str]) -> bool:
    """Whether the file ``path`` starts as a session log does."""
    with open(path, "rb") as fh:
        return fh.read(len(MAGIC)) == MAGIC


def read_log_span(path: str | os.PathLike[str], offset: int = 0) -> LogSpan:
    """The whole records of the log file ``path`` from byte ``offset`` (0: its first),
    as they are in the file; a record being written is left for the next read. Raises
    `TraceFormatError` for a file that is not a session log."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        data = fh.read()
    start = 0
    if offset == 0:
        if len(data) < len(MAGIC) and MAGIC.startswith(data):
            return LogSpan(b"", 0, len(data))  # just made: its first write is under way
        if not data.startswith(MAGIC):
            raise TraceFormatError(f"{os.fspath(path)} is not a session log",
                                   hint="only a task app's trace store writes these files")
        start = len(MAGIC)
    at = start
    while len(data) - at >= _HEAD.size:
        id_size, body_size, rollout_size = _HEAD.unpack_from(data, at)
        size = _HEAD.size + id_size + body_size + (0 if rollout_size == NO_ROLLOUT
                                                   else rollout_size)
        if len(data) - at < size:
            break
        at += size
    return LogSpan(data[start:at], offset + at, offset + len(data))


def read_session_log(path: str | os.PathLike[str], offset: int = 0) -> LogRead:
    """The whole records of the log file ``path`` from byte ``offset`` (see
    `read_log_span`)."""
    span = read_log_span(path, offset)
    data, records, at = span.data, [], 0
    while at < len(data):
        id_size, body_size, rollout_size = _HEAD.unpack_from(data, at)
        start = at + _HEAD.size
        body_at, rollout_at = start + id_size, start + id_size + body_size
        end = rollout_at + (0 if rollout_size == NO_ROLLOUT else rollout_size)
        records.append((data[start:body_at].decode(), data[body_at:rollout_at],
                        None if rollout_size == NO_ROLLOUT else data[rollout_at:end]))
        at = end
    return LogRead(records, span.end, span.size)


@dataclass(frozen=True)
class LogPosition:
    """How far a copier has taken a store's log: a file's number, and the offset in it."""

    file: int = 0
    offset: int = 0


def copy_session_log(store: str | os.PathLike[str], since: LogPosition, dest: Path
                     ) -> tuple[LogPosition, int]:
    """Put the whole records of the log of the store at ``store`` past ``since`` in
    ``dest``, a log file of their own, as they are (nothing is written when there are
    none): how far the copy reaches, and how many bytes of records it holds.

    A part of a record at the end of a file the log has left (a write that failed and
    could not be cut off) is told and passed over."""
    files = session_log_files(store)
    spans, reach = [], since
    for n, path in files:
        if n < since.file:
            continue
        span = read_log_span(path, since.offset if n == since.file else 0)
        spans.append(span.data)
        reach = LogPosition(n, span.end)
        if span.end < span.size and n != files[-1][0]:
            logger.warning("%s: the last %d bytes are not a whole session (a write that "
                           "failed) and were left out", path, span.size - span.end)
    copied = sum(map(len, spans))
    if copied:
        with open(dest, "wb") as out:
            out.write(MAGIC)
            out.writelines(spans)
    return reach, copied


def drop_copied_logs(store: str | os.PathLike[str], upto: LogPosition) -> None:
    """Delete the log files of the store at ``store`` that a copy reaching ``upto`` took
    whole (those the log has left)."""
    for n, path in session_log_files(store):
        if n < upto.file:
            path.unlink(missing_ok=True)


class SessionLog:
    """Appends sessions to the log of the store at ``store``; thread-safe."""

    def __init__(self, store: str | os.PathLike[str], *,
                 rotate_bytes: int = ROTATE_BYTES) -> None:
        self.folder = session_log_folder(store)
        self.rotate_bytes = rotate_bytes
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._size = 0
        # After any file there already (a restarted process's): those are whole.
        self._number = max((n for n, _ in session_log_files(store)), default=0)

    def append(self, session: SessionTrace, rollout: RolloutFacts | None = None) -> bool:
        """Append ``session`` (described by ``rollout``'s facts); False, with nothing
        written, when it holds what msgpack has no type for (store it in rows instead). Raises
        `TraceStoreError` when the write fails (nothing of it is left in the log)."""
        body = encode_session(session)
        described = None if rollout is None else encode(rollout_description(rollout))
        if body is None or (rollout is not None and described is None):
            return False
        key = session.session_id.encode()
        record = b"".join((_HEAD.pack(len(key), len(body), NO_ROLLOUT if described is None
                                      else len(described)), key, body, described or b""))
        with self._lock:
            try:
                if self._fd is None or self._size >= self.rotate_bytes:
                    self._open_next()
                assert self._fd is not None
                written: int | OSError = os.write(self._fd, record)
            except OSError as exc:
                written = exc
            if written == len(record):
                self._size += len(record)
                return True
            if self._fd is not None:
                self._give_up_file()
        raise TraceStoreError(f"cannot append session {session.session_id} to the trace log "
                              f"in {self.folder}: "
                              + (str(written) if isinstance(written, OSError)
                                 else f"{written} of {len(record)} bytes written"),
                              hint="free disk space where the trace store is")

    def _open_next(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.folder.mkdir(parents=True, exist_ok=True)
        self._number += 1
        self._fd = os.open(self.folder / f"{self._number}.log",
                           os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._size = 0
        if os.write(self._fd, MAGIC) != len(MAGIC):
            raise OSError("the file's first bytes could not be written")
        self._size = len(MAGIC)

    def _give_up_file(self) -> None:
        # A part of a record would hide every record after it: cut it off, and write on in
        # a new file (a reader skips a part left in a file that has a successor).
        assert self._fd is not None
        try:
            os.ftruncate(self._fd, self._size)
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


__all__ = ["MAGIC", "NO_ROLLOUT", "ROTATE_BYTES", "LogPosition", "LogRead", "LogSpan",
           "Record", "SessionLog", "copy_session_log", "drop_copied_logs", "is_session_log",
           "read_log_span", "read_session_log", "session_log_files", "session_log_folder"]
