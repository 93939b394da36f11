"""The writer child: a served app's trace commits happen in a process of their own.

A writer thread would share the GIL with the event loop: building statements and the Python
side of every SQLite call would compete with request handling. So a served app's event loop
(`TraceStore.use_writer_process`, called as the server starts) gets a child process for a
local trace file, driven from the loop itself (no thread in between): the sessions finished
in one loop iteration go as one frame, written without blocking, and while a frame is being
committed the sessions finished meanwhile wait for its acknowledgement and go together as
the next (group commit that follows the load: a lone rollout waits for nothing, a busy
server's frames grow with its rate, and no session waits on a timer); the child's
acknowledgements wake the loop through `add_reader` and settle the waiting futures in place.
The child stores them with `commit` (group commit, a bad session failing alone, idempotent
re-writes), checkpoints the WAL from a thread of its own, and acknowledges a session only
once its transaction has committed: an acknowledged write is in the file. A served
rollout's session comes with the facts of its rollout (`RolloutFacts`), which the child
turns into its metadata, so the server's loop never does. A write not acknowledged within
the store's ``write_timeout_s`` fails (one timer watches them all, `LoopWriter._watch`).

    event loop ──frames of (more_coming, [(seq, id, session, facts), ...])──► child stdin
    event loop ◄──frames of [(seq, error or None), ...]── child stdout

A frame is a 4-byte little-endian length and a pickle; in it each session is encoded alone
(`encode_session`: msgpack). The server's frames of sessions carry those bytes beside the
pickle, not in it (`session_frames`): the length has its high bit set, and the pickle, after
a length of its own, names each session's byte count in place of the session, whose bytes
follow the pickle in order. So the loop copies no session's bytes before the pipe does (a
pickle of them would, twice more), and the loop is what a busy server is short of. A
session msgpack cannot hold (an object of the app's own class, which the child could not
rebuild, nor the pickle hold when its module cannot be imported) is not sent: `submit` says
so, and the store's writer thread commits it.
``more_coming`` says other sessions were still being recorded (rollouts still running) when
the frame went: the server is busy, and the child journals them (`_journal`). The child
has its own session (the terminal's Ctrl-C does not cut a commit short) and exits once its
stdin closes, after committing what it read: a parent killed with SIGKILL loses no
acknowledged write and leaves no process behind. Its stderr is the parent's. Its first
frame, sent once the database is open, is empty: until it comes (a new interpreter takes a
moment to start), the server commits through its writer thread, so the first rollouts of
a freshly started server do not wait for the child.

The child is told which database by the first frame the server sends, the store's own
`TraceDbSetting` (a local file: it holds no secret), not by a string on its command line:
what the server resolved is what the child opens, with nothing re-parsed or re-resolved.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO

from synth_deploy import errors as _base_errors
from synth_deploy.errors import TraceStoreError
from synth_deploy.tracing import _errors
from synth_deploy.tracing._config import TraceDbSetting
from synth_deploy.tracing._db._database import TraceDatabase
from synth_deploy.tracing._rollout_facts import (
    RolloutFacts,
    describe_session,
    rollout_description,
)
from synth_deploy.tracing._session import sessions_recording
from synth_deploy.tracing._write import _journal
from synth_deploy.tracing._write._codec import decode_session, encode, encode_session
from synth_deploy.tracing._write._commit import commit
from synth_deploy.tracing._write._flat import restore

_HEAD = struct.Struct("<I")
_READ_CHUNK = 1 << 16
# The high bit of a frame's length: its sessions' bytes follow its pickle (`session_frames`).
_BODIES = 1 << 31
# A frame of sessions holds this many of their bytes at most: its length must fit 31 bits.
# A session past it is not sent (SQLite holds no value that long: its rows are built apart).
_FRAME_BODIES_MAX = 1 << 30
# What the server asks of the pipe to the child (Linux's F_SETPIPE_SZ; its default for an
# unprivileged process is the most it may ask): a busy server's frame goes in one write.
_PIPE_BYTES = 1 << 20
_F_SETPIPE_SZ = 1031
_IOV_MAX = 1024  # buffers one writev takes (POSIX's minimum is 16; Linux's is 1,024)
# What a waiting crowd is committed in: halves, of MIN_SLICE sessions at least. Every
# waiting client's rollout tends to arrive at once; committed whole, the server idles while
# the child commits and the child idles while the server answers, by turns. In halves, the
# first half's clients are answered (and send their next rollouts) while the second half
# commits; a fixed small slice would cost a writer with many sessions in flight a commit
# per slice, where halves cost it one more (bench/trace_throughput.py weighs the choice).
MIN_SLICE = 12

# How long sessions wait for the frame in flight to be acknowledged before they go anyway:
# a child stuck on the file (a reader holding a lock) is sent what comes meanwhile, so
# that each write's own time limit (`LoopWriter._watch`) counts from when it went.
SEND_ANYWAY_S = 0.050


def commit_slices(items: list[Any]) -> list[list[Any]]:
    """``items`` in the slices they are committed in, in order."""
    size = max(MIN_SLICE, -(-len(items) // 2))
    return [items[start:start + size] for start in range(0, len(items), size)]

def frame(payload: Any) -> bytes:
    data = pickle.dumps(payload, pickle.HIGHEST_PROTOCOL)
    return _HEAD.pack(len(data)) + data


def session_frames(more_coming: bool, queued: list[tuple[int, str, bytes, Any]]
                   ) -> list[bytes]:
    """The buffers of the frames that send ``queued`` ((seq, session id, session encoded,
    facts as a tuple or None) each), in order: each frame a head, its pickle of
    ``(more_coming, [(seq, id, byte count, facts), ...])``, then the sessions' bytes as
    they are (the pipe's write copies them, nothing before it)."""
    buffers: list[bytes] = []
    start = 0
    while start < len(queued):
        end, size = start, 0
        while end < len(queued) and size + len(queued[end][2]) <= _FRAME_BODIES_MAX:
            size += len(queued[end][2])
            end += 1
        part = queued[start:end]
        meta = pickle.dumps((more_coming, [(seq, session_id, len(body), facts)
                                           for seq, session_id, body, facts in part]),
                            pickle.HIGHEST_PROTOCOL)
        buffers.append(_HEAD.pack(_BODIES | (_HEAD.size + len(meta) + size))
                       + _HEAD.pack(len(meta)))
        buffers.append(meta)
        buffers += [body for _, _, body, _ in part]
        start = end
    return buffers


class LoopWriter:
    """One writer child for the local trace file ``setting`` names, driven by one event loop.

    `submit` and everything it schedules run on ``loop``; `finish` may be called from any
    thread once the loop no longer submits.
    """

    def __init__(self, setting: TraceDbSetting, loop: asyncio.AbstractEventLoop, *,
                 timeout_s: float | None = None,
                 timeout_error: Callable[[], Exception] = TimeoutError) -> None:
        self.setting, self.display, self.loop = setting, setting.display, loop
        self.timeout_s, self._timeout_error = timeout_s, timeout_error
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "synth_deploy.tracing._write._child"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            raise TraceStoreError(f"cannot start the trace writer process for {self.display}"
                                  f": {exc}", hint="writes go through the writer thread") from exc
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._in_fd, self._out_fd = self._proc.stdin.fileno(), self._proc.stdout.fileno()
        try:
            import fcntl

            fcntl.fcntl(self._in_fd, _F_SETPIPE_SZ, _PIPE_BYTES)
        except (ImportError, OSError):  # not Linux, or not allowed: the default pipe serves
            pass
        os.set_blocking(self._in_fd, False)
        os.set_blocking(self._out_fd, False)
        self._pending: dict[int, asyncio.Future[None]] = {}  # by seq: in the order sent
        self._seq = 0
        # When each frame went: (its last seq, loop time), for `_watch`.
        self._sent_at: collections.deque[tuple[int, float]] = collections.deque()
        self.frames_sent = 0  # of sessions (the setting not counted)
        self._watching = False
        # (seq, session id, session encoded, facts) of those not sent yet
        self._queued: list[tuple[int, str, bytes, RolloutFacts | None]] = []
        self._unacked = 0  # sessions sent and not acknowledged: while any, the queue waits
        self._flushing = False  # a flush is scheduled
        # Framed, not yet taken by the pipe: the buffers in order, the first maybe in part.
        self._unsent: collections.deque[bytes | memoryview] = collections.deque(
            [frame(setting)])
        self._received = bytearray()
        self._waiting_to_write = False
        self.alive = True
        self.ready = False  # the child has opened the store (its first, empty, frame)
        loop.add_reader(self._out_fd, self._read_acks)
        self._write_some()  # the setting first: the child opens nothing until it has it

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self._proc.pid

    # -- on the loop ----------------------------------------------------------------------

    def submit(self, session: Any, rollout: RolloutFacts | None = None
               ) -> asyncio.Future[None] | None:
        """Send ``session`` (and the facts of its rollout, which the child describes it
        by) with the others of this loop iteration; the future is settled once the child
        has committed it, or fails past ``timeout_s``. None, and nothing sent, when
        msgpack has no type for what the session holds or it encodes past
        `_FRAME_BODIES_MAX`."""
        # Encoded alone, so that a journaling child can store it as it comes.
        body = encode_session(session)
        if body is None or len(body) > _FRAME_BODIES_MAX:
            return None
        future = self.loop.create_future()
        if not self.alive:
            future.set_exception(self.exit_error())
            return future
        self._seq += 1
        self._pending[self._seq] = future
        if not self._flushing:  # this iteration's sessions in one frame, or with the next
            self._flushing = True
            # While a frame is in flight they wait for its acknowledgement (which sends
            # them) or SEND_ANYWAY_S. The timer of a queue an acknowledgement sent is left
            # to fire: what has queued by then goes at once, to wait in the pipe beside the
            # frame in flight (the child reads both together). Cancelled, the tail grew
            # and the rate did not (infra/tracing.md).
            if self._unacked:
                self.loop.call_later(SEND_ANYWAY_S, self._flush)
            else:
                self.loop.call_soon(self._flush)
        if not self._watching and self.timeout_s is not None:
            self._watching = True
            self.loop.call_later(self._watch_every_s, self._watch)
        self._queued.append((self._seq, session.session_id, body, rollout))
        return future

    def _flush(self) -> None:
        self._flushing = False
        if self._queued:
            self.frames_sent += 1
            self._sent_at.append((self._seq, self.loop.time()))
            self._unacked += len(self._queued)
            # Sessions still being recorded (rollouts still running) will follow soon.
            self._unsent += self._framed(more_coming=sessions_recording() > 0)
        self._write_some()

    def _framed(self, more_coming: bool) -> list[bytes]:
        sessions = [(seq, session_id, body, None if facts is None else tuple(facts))
                    for seq, session_id, body, facts in self._queued]
        self._queued = []
        return session_frames(more_coming, sessions)

    @property
    def _watch_every_s(self) -> float:
        return min(1.0, max((self.timeout_s or 0) / 4, 0.01))

    def _watch(self) -> None:
        # One timer for every write in flight (not one each): the writes of every frame
        # sent ``timeout_s`` ago and still unacknowledged fail now; the child goes on with
        # them, as a thread's write goes on after its waiter gave up.
        assert self.timeout_s is not None
        oldest = next(iter(self._pending), None)
        overdue_until = 0
        due = self.loop.time() - self.timeout_s
        while self._sent_at and (oldest is None or self._sent_at[0][0] < oldest
                                 or self._sent_at[0][1] <= due):
            last_seq, sent = self._sent_at.popleft()
            if sent <= due:
                overdue_until = last_seq
        for seq in [s for s in self._pending if s <= overdue_until]:
            future = self._pending.pop(seq)
            if not future.done():
                future.set_exception(self._timeout_error())
        self._watching = bool(self._pending) and self.alive
        if self._watching:
            self.loop.call_later(self._watch_every_s, self._watch)

    def _write_some(self) -> None:
        unsent = self._unsent
        while unsent:
            buffers = list(itertools.islice(unsent, _IOV_MAX))
            try:
                sent = os.writev(self._in_fd, buffers)
            except BlockingIOError:
                break
            except OSError:  # the child is gone: its end of stdout tells the rest
                unsent.clear()
                break
            for buffer in buffers:  # what the pipe took goes; a buffer taken in part, in part
                if sent < len(buffer):
                    unsent[0] = memoryview(buffer)[sent:]
                    break
                sent -= len(buffer)
                unsent.popleft()
            if unsent and len(buffers) < _IOV_MAX:
                break  # the pipe is full: the loop says when it has room
        if self._unsent and not self._waiting_to_write:
            self.loop.add_writer(self._in_fd, self._write_some)
            self._waiting_to_write = True
        elif not self._unsent and self._waiting_to_write:
            self.loop.remove_writer(self._in_fd)
            self._waiting_to_write = False

    def _read_acks(self) -> None:
        try:
            data = os.read(self._out_fd, _READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._died()
            return
        self._received += data
        while len(self._received) >= _HEAD.size:
            (size,) = _HEAD.unpack_from(self._received)
            if len(self._received) < _HEAD.size + size:
                break
            acks = pickle.loads(self._received[_HEAD.size:_HEAD.size + size])
            del self._received[:_HEAD.size + size]
            self.ready = True
            self._unacked -= len(acks)
            for seq, error in acks:
                future = self._pending.pop(seq, None)
                if future is not None and not future.done():  # done: its waiter timed out
                    if error is None:
                        future.set_result(None)
                    else:
                        future.set_exception(_rebuild(error))
        if not self._unacked and self._queued:  # what waited for the frame in flight goes
            self._flush()

    def _died(self) -> None:
        self.alive = False
        self.loop.remove_reader(self._out_fd)
        if self._waiting_to_write:
            self.loop.remove_writer(self._in_fd)
            self._waiting_to_write = False
        error = self.exit_error()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()

    def exit_error(self) -> TraceStoreError:
        """What the child's exit is told as (its code, once it has one)."""
        code = self._proc.poll()
        return TraceStoreError(
            f"the trace writer process for {self.display} exited"
            + (f" (code {code})" if code is not None else "") + " before committing",
            hint="nothing acknowledged is lost; its error, if any, is in this process's stderr")

    # -- from any thread ------------------------------------------------------------------

    def finish(self, timeout_s: float | None) -> bool:
        """Send what is left, close the child's input and wait for it to commit and exit:
        whether every write was committed. The child builds the rows of what it journaled
        before it exits, for a moment at most (`_journal.EXIT_BUILD_S`)."""
        settled = not self._pending and not self._queued and not self._unsent
        if self.loop.is_running() and not self.loop.is_closed():
            done: concurrent.futures.Future[None] = concurrent.futures.Future()
            try:
                self.loop.call_soon_threadsafe(self._hand_over, done)
                done.result(timeout_s)
            except (RuntimeError, concurrent.futures.TimeoutError):
                pass
        else:
            self._hand_over(None)
        # Settled, it still builds what it journaled, for `_journal.EXIT_BUILD_S` at most.
        wait_s = timeout_s if not settled else _journal.EXIT_BUILD_S + 1.0 \
            if timeout_s is None else min(timeout_s, _journal.EXIT_BUILD_S + 1.0)
        try:
            self._proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            threading.Thread(target=self._proc.wait, daemon=True,
                             name="synth-deploy-trace-writer-reaper").start()
            return settled
        return True

    def _hand_over(self, done: concurrent.futures.Future[None] | None) -> None:
        # Whatever the loop did not send goes now, blocking: the child is reading.
        if self._queued:
            self.frames_sent += 1
            self._unsent += self._framed(more_coming=False)
        if self._waiting_to_write and not self.loop.is_closed():
            self.loop.remove_writer(self._in_fd)
            self._waiting_to_write = False
        assert self._proc.stdin is not None
        try:
            os.set_blocking(self._in_fd, True)
            for buffer in self._unsent:
                self._proc.stdin.write(buffer)
            self._unsent.clear()
            self._proc.stdin.close()
        except OSError:
            pass
        if done is not None:
            done.set_result(None)


def _describe(exc: BaseException) -> tuple[str, str, str | None]:
    if isinstance(exc, TraceStoreError):
        return type(exc).__name__, exc.message, exc.hint
    return "TraceStoreError", f"{type(exc).__name__}: {exc}", None


def _rebuild(error: tuple[str, str, str | None]) -> TraceStoreError:
    kind, message, hint = error
    cls = getattr(_errors, kind, None) or getattr(_base_errors, kind, TraceStoreError)
    if not (isinstance(cls, type) and issubclass(cls, TraceStoreError)):
        cls = TraceStoreError
    return cls(message, hint=hint)


# -- the child --------------------------------------------------------------------------------


def main() -> None:
    """Commit the sessions read from stdin to the database its first frame names (a
    `TraceDbSetting`); acknowledge each on stdout.

    One thread: read a frame, take every frame already waiting too (group commit), commit
    them in `commit_slices`, each one transaction (a bad session fails alone) answered with
    one frame. While a commit runs, what the server sends waits in the pipe. While the
    server is busy (`_ServerLoad`), sessions that come with others (a batch of several, or
    other rollouts still running) go to the journal, whose rows are built between batches
    once the server is not busy. Once its input closes and what it read is committed, the
    child builds what is still journaled for `_journal.EXIT_BUILD_S` at most (a short run's
    traces are then whole in the file), and leaves the rest to the next store that opens the
    file (a reader, the next server, `traces pull`): a stopping server (a Modal container
    draining) waits a moment at most.
    """
    stdout = sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but frames may reach the parent's pipe
    frames = _FrameReader(sys.stdin.buffer.fileno())
    try:
        setting = frames.setting()
        db = TraceDatabase(setting, create=False)
    except Exception as exc:  # then every write the parent sends gets this error
        error = _describe(exc)
        _send(stdout, [])
        while (items := frames.next_batch()) is not None:
            _send(stdout, [(seq, error) for seq, *_ in items])
        return
    db.checkpoint_in_background()  # commits here never stop to checkpoint
    parent_gone = not _send(stdout, [])  # ready
    journaled = _journal.waiting(db)  # a killed predecessor's, if any
    server = _ServerLoad(os.getppid())
    try:
        while True:
            # Rows are built between batches while the server is not busy: its CPU first.
            if journaled and not frames.waiting(0.0):
                if not server.busy():
                    taken = _journal.expand(db, limit=_journal.CHUNK)
                    journaled = journaled - taken if taken == _journal.CHUNK else 0
                    continue
                if not frames.waiting(_journal.IDLE_S):
                    continue  # look again in a while
            items = frames.next_batch()
            if items is None:
                break
            # Building rows now would take a busy server's CPU: journal them, when others
            # come with them (a lone session is stored in rows whatever the load).
            journal = (len(items) > 1 or frames.more_coming) and server.busy()
            for part in commit_slices(items):
                outcomes, added = _store(db, part, journal)
                journaled += added
                acks = [(seq, None if error is None else _describe(error))
                        for (seq, *_), error in zip(part, outcomes, strict=True)]
                parent_gone = parent_gone or not _send(stdout, acks)  # commits go on anyway
        if journaled:  # the rest is built by the next store that opens the file
            _journal.expand(db, until=time.monotonic() + _journal.EXIT_BUILD_S)
    finally:
        db.close()


def _store(db: TraceDatabase, part: list[tuple[int, str, Any, Any]], journal: bool
           ) -> tuple[list[BaseException | None], int]:
    """Store the sessions of ``part`` ((seq, session id, session as it came, facts or None)
    each), described by their rollout's facts: in the journal when ``journal`` and it came
    encoded (`encode_session`), else in rows (`commit`). Each one's outcome, and how many
    were journaled."""
    outcomes: list[BaseException | None] = [None] * len(part)
    rows: list[tuple[int, Any, Any]] = []  # (place, session, facts) of those stored in rows
    entries: list[tuple[str, bytes, bytes | None]] = []
    journaled: list[tuple[int, Any, Any]] = []
    for place, (_, session_id, session, facts) in enumerate(part):
        if journal and type(session) is bytes:
            try:
                rollout = None if facts is None else encode(
                    rollout_description(RolloutFacts(*facts)))
            except Exception as exc:
                outcomes[place] = exc
                continue
            if facts is None or rollout is not None:
                entries.append((session_id, session, rollout))
                journaled.append((place, session, facts))
                continue
        rows.append((place, session, facts))
    if entries:
        try:
            _journal.append(db, entries)
        except Exception:  # stored in rows instead, where each one's error is told
            rows += journaled
            entries = []
    stored = _commit_described(db, [(session, facts) for _, session, facts in rows])
    for (place, _, _), outcome in zip(rows, stored, strict=True):
        outcomes[place] = outcome
    return outcomes, len(entries)


def _commit_described(db: TraceDatabase, part: list[tuple[Any, Any]]
                      ) -> list[BaseException | None]:
    """`commit` the sessions of ``part`` ((session as it came, facts or None) each),
    described by their rollout's facts first; one that cannot be fails alone."""
    outcomes: list[BaseException | None] = [None] * len(part)
    sessions, places = [], []
    for place, (session, facts) in enumerate(part):
        try:
            restored = (decode_session(session) if type(session) is bytes
                        else restore(session))
            if facts is not None:
                describe_session(restored, RolloutFacts(*facts))
        except Exception as exc:
            outcomes[place] = exc
            continue
        sessions.append(restored)
        places.append(place)
    for place, outcome in zip(places, commit(db, sessions), strict=True):
        outcomes[place] = outcome
    return outcomes


class _ServerLoad:
    """Whether the server (this child's parent) is busy: running or waiting to run when
    looked at, or having used over half a core in the last `WINDOW_S` or more; from /proc
    (never busy where there is none). The pipe alone cannot tell: a loaded server's
    batches come in waves, with silences between them while it works."""

    WINDOW_S = 0.1
    BUSY_SHARE = 0.5
    LOOK_EVERY_S = 0.01  # a busy server's batches come every few ms: one look serves several

    def __init__(self, pid: int) -> None:
        self._stat = f"/proc/{pid}/stat"
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        sample = self._read()
        self._at, self._cpu_s = time.monotonic(), None if sample is None else sample[1]
        self._was_busy = False
        self._looked_at, self._busy = float("-inf"), False

    def _read(self) -> tuple[bytes, float] | None:
        """(state, utime + stime in seconds), or None."""
        try:
            with open(self._stat, "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            return fields[0], (int(fields[11]) + int(fields[12])) / self._tick
        except (OSError, IndexError, ValueError):
            return None

    def busy(self) -> bool:
        now = time.monotonic()
        if now - self._looked_at < self.LOOK_EVERY_S:
            return self._busy
        sample = self._read()
        if sample is None:
            return False
        state, cpu_s = sample
        if now - self._at >= self.WINDOW_S:
            if self._cpu_s is not None:
                self._was_busy = (cpu_s - self._cpu_s) / (now - self._at) > self.BUSY_SHARE
            self._at, self._cpu_s = now, cpu_s
        self._looked_at, self._busy = now, state == b"R" or self._was_busy
        return self._busy


class _FrameReader:
    """Frames from a blocking pipe: `next_batch` waits for one, then takes those queued."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = bytearray()
        self.closed = False
        self.more_coming = False  # what the newest frame said

    def setting(self) -> TraceDbSetting:
        """The first frame: the database to commit to."""
        setting = self._next()
        if not isinstance(setting, TraceDbSetting):
            raise TraceStoreError("the trace writer process was not told its database",
                                  hint="its first frame must be the store's TraceDbSetting")
        return setting

    def next_batch(self, limit: int = 256) -> list[Any] | None:
        """The sessions of the next frame and of every frame already waiting."""
        first = self._next()
        if first is None:
            return None
        more_coming, items = first
        while len(items) < limit and self.waiting(0.0):
            following = self._next()
            if following is None:
                break
            more_coming, frame_items = following
            items.extend(frame_items)
        self.more_coming = more_coming
        return items

    def waiting(self, timeout_s: float) -> bool:
        """Whether a frame is here or arrives within ``timeout_s``."""
        if self._complete() or self.closed:
            return self._complete()
        return bool(select.select([self.fd], [], [], timeout_s)[0])

    def _complete(self) -> bool:
        if len(self.buffer) < _HEAD.size:
            return False
        return len(self.buffer) >= _HEAD.size + (_HEAD.unpack_from(self.buffer)[0] & ~_BODIES)

    def _next(self) -> Any:
        while not self._complete():
            if self.closed:
                return None
            chunk = os.read(self.fd, _READ_CHUNK)
            if not chunk:
                self.closed = True
                return None
            self.buffer += chunk
        (size,) = _HEAD.unpack_from(self.buffer)
        end = _HEAD.size + (size & ~_BODIES)
        if not size & _BODIES:
            payload = pickle.loads(self.buffer[_HEAD.size:end])
        else:  # sessions whose bytes follow the pickle (`session_frames`)
            (meta_size,) = _HEAD.unpack_from(self.buffer, _HEAD.size)
            at = 2 * _HEAD.size + meta_size
            more_coming, items = pickle.loads(self.buffer[2 * _HEAD.size:at])
            sessions = []
            for seq, session_id, length, facts in items:
                sessions.append((seq, session_id, bytes(self.buffer[at:at + length]), facts))
                at += length
            payload = (more_coming, sessions)
        del self.buffer[:end]
        return payload


def _send(stdout: BinaryIO, acks: list[Any]) -> bool:
    try:
        stdout.write(frame(acks))
        stdout.flush()
        return True
    except (OSError, ValueError):
        return False


if __name__ == "__main__":
    main()
