"""The session log: how a store whose readers are elsewhere keeps each session.

A Modal container's sessions are read at home (`traces pull`), from the files its
`VolumeSnapshots` puts on the app's Volume; nothing in the container reads them. So they
need no rows there, no writer child, no commit and no file of their own: the server makes
each finished session a record (the session as msgpack, `_codec`, the cheapest encoding
measured for its thread, and what its rollout's facts say of it, keys masked first, so no
secret is ever written) and the store's log holds the record in memory, until the copier
takes every record held (`SessionLog.take`) and writes them to the Volume as one file
(`write_session_log`): no parsing, no SQL. `merge_trace_file` decodes such a file at home.

A record is a header (the lengths of the session id, the body and the rollout description,
`NO_ROLLOUT` for none; little-endian) and those bytes; a log file is `MAGIC` and a run of
whole records. A reader takes whole records only (`read_session_log`): a file cut short
(a download that stopped) shows how many bytes at its end are not a whole one.

Why memory and not a file beside the store: a container's disk goes with the container,
so a record in a file there outlives nothing a record in memory does not, and the file cost
the server a write and the copier a read of every session (infra/tracing.md). What a
killed container loses is what it recorded since its last copy. A copy that fails gives
its records back, ahead of those recorded since (`SessionLog.give_back`), and a log that
holds more than its limit (the Volume's copies failing for a long while) refuses new
sessions: their rollouts answer 500, as on a full disk, before the container's memory runs
out. The limit follows the memory (`pending_limit`): a quarter of the container's (the lower
of its Modal ``memory`` setting and its cgroup's limit, where either is known), from 16 MiB
up to `PENDING_LIMIT`; 256 MiB when neither is known.

A process has one log per store (`session_log`): the store appends, the copier takes.
"""

from __future__ import annotations

import os
import re
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from synth_deploy.errors import TraceStoreError
from synth_deploy.tracing._errors import SchemaTooNewError, TraceFormatError
from synth_deploy.tracing._rollout_facts import RolloutFacts, rollout_description
from synth_deploy.tracing._session import SessionTrace
from synth_deploy.tracing._write._codec import encode, encode_session

MAGIC = b"synth-deploy session log 1\n"
_MAGIC_OF_ANY_VERSION = re.compile(rb"synth-deploy session log (\d{1,9})\n")
_HEAD = struct.Struct("<III")
NO_ROLLOUT = 0xFFFFFFFF
# What a log may hold before it refuses sessions: some minutes of a busy container's, and
# at most a quarter of the process's memory where that is known (`pending_limit`).
PENDING_LIMIT = 256 << 20
PENDING_SHARE = 4
PENDING_FLOOR = 16 << 20

# (session id, body, rollout description or None), each encoded by `_codec`.
Record = tuple[str, bytes, bytes | None]


@dataclass(frozen=True)
class LogRead:
    """What `read_session_log` found: the whole records, where the last one ends, and the
    file's size."""

    records: list[Record]
    end: int
    size: int


def is_session_log(path: str | os.PathLike[str]) -> bool:
    """Whether the file ``path`` starts as a session log does (of any format version:
    `read_session_log` says when a newer kit wrote it)."""
    with open(path, "rb") as fh:
        return _MAGIC_OF_ANY_VERSION.match(fh.read(len(MAGIC) + 8)) is not None


def write_session_log(path: str | os.PathLike[str], records: list[bytes]) -> int:
    """A log file at ``path`` holding ``records`` (as `SessionLog.take` gave them); the
    bytes of records it holds."""
    with open(path, "wb") as out:
        out.write(MAGIC)
        out.writelines(records)
    return sum(map(len, records))


def read_session_log(path: str | os.PathLike[str]) -> LogRead:
    """The whole records of the log file ``path``. Raises `TraceFormatError` for a file
    that is not a session log."""
    with open(path, "rb") as fh:
        data = fh.read()
    if not data.startswith(MAGIC):
        if magic := _MAGIC_OF_ANY_VERSION.match(data):
            raise SchemaTooNewError(
                f"{os.fspath(path)} is a session log of format {int(magic[1])}, newer than "
                "this synth-deploy reads (1); it was left as is",
                hint="upgrade synth-deploy (pip install -U synth-deploy)")
        raise TraceFormatError(f"{os.fspath(path)} is not a session log",
                               hint="only a task app's trace store writes these files")
    records, at = [], len(MAGIC)
    while len(data) - at >= _HEAD.size:
        id_size, body_size, rollout_size = _HEAD.unpack_from(data, at)
        start = at + _HEAD.size
        body_at, rollout_at = start + id_size, start + id_size + body_size
        end = rollout_at + (0 if rollout_size == NO_ROLLOUT else rollout_size)
        if end > len(data):
            break
        try:
            session_id = data[start:body_at].decode()
        except UnicodeDecodeError:  # the copier writes ids as it got them: UTF-8
            raise TraceFormatError(
                f"{os.fspath(path)}: record {len(records) + 1} (byte {at}) has a session id "
                f"that is not UTF-8 ({data[start:body_at][:24]!r}): the file is damaged",
                hint="only a task app's trace store writes these files") from None
        records.append((session_id, data[body_at:rollout_at],
                        None if rollout_size == NO_ROLLOUT else data[rollout_at:end]))
        at = end
    return LogRead(records, at, len(data))


def pending_limit(memory_bytes: int | None) -> int:
    """The bytes a log may hold in a process with ``memory_bytes`` of memory (None: not
    known): a quarter of it, at least `PENDING_FLOOR`, at most `PENDING_LIMIT`."""
    if not memory_bytes:
        return PENDING_LIMIT
    return max(PENDING_FLOOR, min(PENDING_LIMIT, memory_bytes // PENDING_SHARE))


class SessionLog:
    """Sessions encoded as records and held until a copier takes them; thread-safe."""

    def __init__(self, *, limit_bytes: int = PENDING_LIMIT) -> None:
        self.limit_bytes = limit_bytes
        self._lock = threading.Lock()
        self._records: list[bytes] = []
        self._bytes = 0

    @property
    def held_bytes(self) -> int:
        """The bytes of the records held, not yet taken."""
        return self._bytes

    def append(self, session: SessionTrace, rollout: RolloutFacts | None = None) -> bool:
        """Hold ``session`` (described by ``rollout``'s facts); False, with nothing held,
        when it holds what msgpack has no type for (store it in rows instead). Raises
        `TraceStoreError` when the log is full (its copies have been failing)."""
        body = encode_session(session)
        described = None if rollout is None else encode(rollout_description(rollout))
        if body is None or (rollout is not None and described is None):
            return False
        key = session.session_id.encode()
        record = b"".join((_HEAD.pack(len(key), len(body), NO_ROLLOUT if described is None
                                      else len(described)), key, body, described or b""))
        with self._lock:
            if self._bytes + len(record) > self.limit_bytes:
                held = self._bytes
            else:
                self._records.append(record)
                self._bytes += len(record)
                return True
        raise TraceStoreError(f"cannot hold session {session.session_id}: the trace log "
                              f"holds {held >> 20} MB not yet copied to the trace Volume",
                              hint="the copies are failing: see the warnings above (it "
                                   f"holds at most {self.limit_bytes >> 20} MiB: a quarter "
                                   "of the container's memory, where known)")

    def take(self) -> list[bytes]:
        """Every record held, oldest first; the log holds none after."""
        with self._lock:
            records, self._records, self._bytes = self._records, [], 0
        return records

    def give_back(self, records: list[bytes]) -> None:
        """Hold ``records`` (taken, not copied) again, ahead of those held since."""
        with self._lock:
            self._records[:0] = records
            self._bytes += sum(map(len, records))


_LOGS: dict[Path, SessionLog] = {}
_LOGS_LOCK = threading.Lock()


def session_log(store: str | os.PathLike[str], limit_bytes: int | None = None) -> SessionLog:
    """This process's log of the store at ``store``: the one its store appends to and its
    copier takes from. ``limit_bytes``: what it may hold (the store's setting says; None
    leaves it as it is, `PENDING_LIMIT` for a new one)."""
    key = Path(store).resolve()
    with _LOGS_LOCK:
        log = _LOGS.get(key)
        if log is None:
            log = _LOGS[key] = SessionLog()
        if limit_bytes is not None:
            log.limit_bytes = limit_bytes
        return log


__all__ = ["MAGIC", "NO_ROLLOUT", "PENDING_LIMIT", "LogRead", "Record", "SessionLog",
           "is_session_log", "pending_limit", "read_session_log", "session_log",
           "write_session_log"]
