"""Tracing at RL scale: the writer process, ids, batch SQL, streaming export, totals, reads.

Speed itself is measured in bench/trace_throughput.py and bench/trace_store.py; these tests
pin down the mechanisms (and that nothing is given up for them).
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import os
import pickle
import select
import signal
import sqlite3
import struct
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import msgspec
import pytest
from processes import free_port, wait_until_up
from rollouts import SERVER_SCRIPT, fire, rollout_body
from sessions import assert_same, make_session
from trace_files import ready_writer_child, statements_run

from synth_deploy.serving import create_app
from synth_deploy.tracing import (
    SCHEMA_VERSION,
    SessionFilter,
    SessionNotFoundError,
    SessionTracer,
    TraceStore,
    browse_sessions,
    export_sft,
    filter_choices,
    open_trace_store,
    parse_trace_db,
    sft_examples,
)

WRITER_MODULE = b"synth_deploy.tracing._write._child"


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def writer_children(parent: int) -> set[int]:
    """Pids of the running trace writer processes ``parent`` started (read from /proc)."""
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == parent and state != "Z" and WRITER_MODULE in cmdline:
            found.add(int(pid))
    return found


# -- the writer process -----------------------------------------------------------------------


def test_a_served_app_commits_in_a_child_process_not_a_thread(tmp_path, serve, math_config,
                                                              api_key, mock_policy):
    path = tmp_path / "t.db"
    before = writer_children(os.getpid())  # other tests' children, exiting
    with open_trace_store(path) as store:
        server = serve(create_app(math_config, api_keys=[api_key], trace_store=store))
        here = statements_run(store)  # what the server's own connection runs
        url = mock_policy.url + "/v1"
        # Until its writer child is ready the server commits itself: warm up until a
        # rollout's trace no longer passes through this process.
        deadline = time.monotonic() + 15
        warm = 0
        while True:
            here.clear()
            warm += 1
            body = [rollout_body(f"warm-{warm}", warm, url)]
            assert asyncio.run(fire(server.url, api_key, body))[0][1] == 200
            if not [sql for sql in here if "INSERT" in sql.upper()]:
                break
            assert time.monotonic() < deadline, "the writer child never took over"
            time.sleep(0.05)
        (child,) = writer_children(os.getpid()) - before
        # told its database by the store's setting, not by a path on its command line
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        assert str(path).encode() not in cmdline and b"t.db" not in cmdline
        here.clear()
        bodies = [rollout_body(f"run-{i}", i, url) for i in range(40)]
        results = asyncio.run(fire(server.url, api_key, bodies))
        assert all(status == 200 for _, status in results)
        assert not [sql for sql in here if "INSERT" in sql.upper()]
        assert store.count_sessions() == 40 + warm
        # what the child stored is whole: the math app's turn, its LM call and its rewards
        for summary in store.list_sessions(limit=None):
            if not summary.run_id.startswith("run-"):
                continue
            stored = store.get_session(summary.session_id)
            assert [m.message_type for m in stored.messages] == ["system", "user", "assistant"]
            assert [e.event_type for e in stored.events] == ["cais", "environment"]
            assert stored.event_rewards and stored.outcome_rewards, summary.run_id
    assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_new_servers_first_writes_do_not_wait_for_its_writer_child(tmp_path):
    # A child takes a few tenths of a second to start: until it says it is ready, this
    # process commits; then the child does.
    path = tmp_path / "t.db"
    with open_trace_store(path) as store:
        here = statements_run(store)

        async def main():
            child = store.use_writer_process()
            await store.write_session(make_session(0))
            assert not child.ready and [sql for sql in here if "INSERT" in sql.upper()]
            while not child.ready:
                await asyncio.sleep(0.01)
            here.clear()
            await store.write_session(make_session(1))
            assert not [sql for sql in here if "INSERT" in sql.upper()]

        asyncio.run(main())
        assert {s.run_id for s in store.list_sessions(limit=None)} == {"run-0", "run-1"}


def test_a_killed_writer_fails_its_writes_and_the_next_write_starts_another(tmp_path,
                                                                            caplog):
    path = tmp_path / "t.db"
    store = open_trace_store(path)

    async def main():
        first = store.use_writer_process()
        while not first.ready:
            await asyncio.sleep(0.01)
        await store.write_session(make_session(0))
        os.kill(first.pid, signal.SIGSTOP)  # a write in flight when it dies
        pending = asyncio.ensure_future(store.write_session(make_session(1)))
        await asyncio.sleep(0.05)
        os.kill(first.pid, signal.SIGKILL)
        with pytest.raises(Exception, match="trace writer process .* exited"):
            await pending
        with caplog.at_level(logging.WARNING, logger="synth_deploy.tracing"):
            await store.write_session(make_session(2))  # a new child (the thread meanwhile)
        assert store.use_writer_process() is not first
        [said] = [r.getMessage() for r in caplog.records if "writer" in r.getMessage()]
        assert "exited" in said and "a new one takes over" in said, said

    asyncio.run(main())
    store.close()
    with open_trace_store(path) as check:
        assert {s.run_id for s in check.list_sessions(limit=None)} == {"run-0", "run-2"}


def test_a_write_the_writer_child_holds_past_the_timeout_fails_and_is_stored_later(
        tmp_path):
    # One timer watches every write in flight: a child that stops answering fails the
    # writes waiting on it after write_timeout_s (not never), and the writes go on.
    path = tmp_path / "t.db"
    store = TraceStore(parse_trace_db(str(path)), write_timeout_s=0.5)

    async def main():
        child = await ready_writer_child(store)
        await store.write_session(make_session(0))
        os.kill(child.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(Exception, match=r"did not finish within 0.5s"):
                await store.write_session(make_session(1))
            waited = time.monotonic() - started
        finally:
            os.kill(child.pid, signal.SIGCONT)
        assert 0.5 <= waited < 1.5, waited
        await store.write_session(make_session(2))  # the same child, answering again
        assert store.use_writer_process() is child

    asyncio.run(main())
    store.close()
    with open_trace_store(path) as check:
        assert {s.run_id for s in check.list_sessions(limit=None)} == {"run-0", "run-1",
                                                                         "run-2"}


def test_what_the_writer_process_stores_reads_back_as_written(tmp_path):
    # Every part of a session crosses the pipe: timesteps, events of each kind, messages
    # (text and structured), event and outcome rewards, tool calls and their metadata.
    sessions = [make_session(i) for i in range(3)] + [tool_session()]
    assert all(s.timesteps and s.events and s.messages and s.event_rewards
               and s.outcome_rewards for s in sessions[:3])
    with open_trace_store(tmp_path / "t.db") as store:
        here = statements_run(store)

        async def main():
            await ready_writer_child(store)
            here.clear()
            await asyncio.gather(*(store.write_session(s) for s in sessions))

        asyncio.run(main())
        assert not [sql for sql in here if "INSERT" in sql.upper()], "the child must commit"
        for session in sessions:
            assert_same(store.get_session(session.session_id).to_dict(), session.to_dict())


def test_a_session_goes_to_the_child_at_once_when_no_frame_is_in_flight(tmp_path):
    # Sessions wait for the acknowledgement of the frame in flight, never on a timer: with
    # other rollouts still running and nothing in flight, a written session's frame goes
    # in the loop iteration after its write.
    with open_trace_store(tmp_path / "t.db") as store:
        async def main():
            child = await ready_writer_child(store)
            running = SessionTracer()  # a rollout still running
            went = []
            for i in range(5):
                before = child.frames_sent
                write = asyncio.ensure_future(store.write_session(make_session(i)))
                for _ in range(3):
                    await asyncio.sleep(0)
                went.append(child.frames_sent - before)
                await write
            running.finish()
            return went

        assert asyncio.run(main()) == [1] * 5
        assert store.count_sessions() == 5


def test_sessions_finished_while_a_frame_commits_go_together_in_the_next(tmp_path):
    # While the child commits a frame (held up here by another connection's write lock),
    # the sessions finished meanwhile, loop iterations apart, wait for its acknowledgement
    # and go together: one write to the pipe and one wakeup of the child, not one each. Held
    # up past SEND_ANYWAY_S, it is sent them anyway. Written one after another with
    # nothing in flight, each goes alone, at once.
    path = tmp_path / "t.db"
    with open_trace_store(path) as store:
        async def main():
            child = await ready_writer_child(store)
            before = child.frames_sent
            lock = sqlite3.connect(path, isolation_level=None)
            lock.execute("BEGIN IMMEDIATE")  # the child's commit waits for it
            try:
                writes = [asyncio.ensure_future(store.write_session(make_session(0)))]
                await asyncio.sleep(0.01)
                for i in range(1, 5):
                    writes.append(asyncio.ensure_future(store.write_session(make_session(i))))
                    await asyncio.sleep(0)
                held = child.frames_sent - before  # the first frame only: it is in flight
                await asyncio.sleep(0.25)
                anyway = child.frames_sent - before
            finally:
                lock.execute("COMMIT")
                lock.close()
            await asyncio.gather(*writes)
            before = child.frames_sent
            for i in range(5, 8):
                await store.write_session(make_session(i))
            return held, anyway, child.frames_sent - before

        held, anyway, alone = asyncio.run(main())
        assert store.count_sessions() == 8
    assert (held, anyway, alone) == (1, 2, 3)


def frame(payload) -> bytes:
    """The writer child's pipe protocol as its module documents it: a 4-byte little-endian
    length and a pickle; the server sends (more_coming, [(seq, id, session, facts), ...])
    (`item`), the child answers [(seq, error), ...]."""
    data = pickle.dumps(payload)
    return struct.pack("<I", len(data)) + data


def item(seq: int, session, facts=None) -> tuple:
    """One session of a frame: the facts of its rollout, or None."""
    return (seq, session.session_id, session, facts)


def read_frame(pipe):
    head = pipe.read(4)
    if not head:
        return None
    return pickle.loads(pipe.read(struct.unpack("<I", head)[0]))


def writer_acks(path: Path, send) -> list[list[tuple]]:
    """Run a writer child for ``path``, call ``send(child)`` (it writes to the child's
    stdin), close its input; the frames it answered, each a list of (seq, error or None)."""
    open_trace_store(path).close()
    child = subprocess.Popen([sys.executable, "-m", WRITER_MODULE.decode()],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        child.stdin.write(frame(parse_trace_db(str(path))))  # as `TraceStore` tells it
        child.stdin.flush()
        assert read_frame(child.stdout) == []  # ready
        send(child)
        child.stdin.close()
        answers = []
        while (acks := read_frame(child.stdout)) is not None:
            answers.append(acks)
        assert child.wait(30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return answers


def writer_answers(path: Path, send) -> list[list[int]]:
    """`writer_acks`, all without error: the seqs of each frame."""
    answers = writer_acks(path, send)
    assert [error for acks in answers for _, error in acks] == [None] * sum(map(len, answers))
    return [[seq for seq, _ in acks] for acks in answers]


def test_the_writer_child_opens_the_setting_it_is_sent_and_never_parses_a_path(tmp_path):
    # The server's resolved setting is the child's only source: a path sent as text (what
    # the command line used to carry) opens nothing, and every write is answered so.
    path = tmp_path / "t.db"
    open_trace_store(path).close()
    child = subprocess.Popen([sys.executable, "-m", WRITER_MODULE.decode()],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL)
    try:
        child.stdin.write(frame(str(path)) + frame((False, [item(1, make_session(1))])))
        child.stdin.close()
        assert read_frame(child.stdout) == []
        [(seq, (kind, message, hint))] = read_frame(child.stdout)
        assert child.wait(30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert seq == 1 and kind == "TraceStoreError" and "not told its database" in message
    assert "TraceDbSetting" in hint
    with open_trace_store(path) as store:
        assert store.count_sessions() == 0


def test_a_session_the_child_cannot_store_fails_alone_with_its_error(tmp_path):
    path = tmp_path / "t.db"
    stored = make_session(0)
    with open_trace_store(path) as store:
        store.write_session_sync(stored)
    changed = copy.deepcopy(stored)
    changed.metadata["extra"] = "other content under the same id"

    def send(child):
        child.stdin.write(frame((False, [item(1, changed), item(2, make_session(2)),
                                    item(3, stored)])))

    (acks,) = writer_acks(path, send)
    assert [seq for seq, _ in acks] == [1, 2, 3]
    kind, message, _hint = acks[0][1]
    assert kind == "SessionConflictError" and "different content" in message
    assert acks[1][1] is None and acks[2][1] is None  # stored, and already stored alike
    with open_trace_store(path) as store:
        assert store.count_sessions() == 2
        assert "extra" not in store.get_session(stored.session_id).metadata


def test_a_session_whose_rollout_cannot_be_described_fails_alone(tmp_path):
    # The child describes each served session from its rollout's facts before committing:
    # facts it cannot read fail that session, not the child or the others.
    path = tmp_path / "t.db"
    head = {"app_id": "math", "run_id": "r"}
    good = (head, 0.5, b'{"run_id": "r"}', b'{"metrics": {"num_steps": 1}}', None)
    unreadable = (head, 0.5, b"{not json", None, None)

    def send(child):
        child.stdin.write(frame((False, [item(1, make_session(1), good),
                                    item(2, make_session(2), unreadable),
                                    item(3, make_session(3))])))

    (acks,) = writer_acks(path, send)
    assert [seq for seq, _ in acks] == [1, 2, 3]
    assert acks[0][1] is None and acks[2][1] is None
    assert "ValueError" in acks[1][1][1]
    with open_trace_store(path) as store:
        assert {s.run_id for s in store.list_sessions(limit=None)} == {"run-1", "run-3"}
        described = store.get_session(next(s.session_id for s in store.list_sessions()
                                           if s.run_id == "run-1")).metadata
        assert (described["duration_s"], described["metrics"]) == (0.5, {"num_steps": 1})


@pytest.mark.parametrize(("waiting", "slices"), [(40, [20, 20]), (20, [12, 8]), (5, [5])])
def test_the_writer_commits_a_crowd_in_halves_answering_each_once_committed(tmp_path, waiting,
                                                                             slices):
    path = tmp_path / "t.db"

    def send(child):  # one frame, as when that many clients wait at once
        child.stdin.write(frame((False, [item(seq, make_session(seq)) for seq in range(waiting)])))

    answers = writer_answers(path, send)
    assert [len(acks) for acks in answers] == slices
    assert [seq for acks in answers for seq in acks] == list(range(waiting))
    with open_trace_store(path) as store:
        assert store.count_sessions() == waiting


def frame_with_bodies(more_coming: bool, sessions: list) -> bytes:
    """A frame of sessions as the server sends them: the length with its high bit set, a
    length and a pickle of (more_coming, [(seq, id, byte count, facts), ...]), then each
    session's bytes (msgpack of ``[session, packed turns]``) in order."""
    bodies = [msgspec.msgpack.encode([session, None]) for session in sessions]
    meta = pickle.dumps((more_coming, [(seq, session.session_id, len(body), None)
                                       for seq, (session, body) in enumerate(
                                           zip(sessions, bodies, strict=True))]))
    payload = struct.pack("<I", len(meta)) + meta + b"".join(bodies)
    return struct.pack("<I", (1 << 31) | len(payload)) + payload


def test_the_writer_reads_sessions_whose_bytes_follow_the_frames_pickle(tmp_path):
    # Bodies of several sizes (one past the pipe's 64 KiB default) between plain frames:
    # each session is cut from the bytes at its own count, and stored as it was sent.
    path = tmp_path / "t.db"
    sessions = [make_session(0), make_session(1), make_session(2)]
    sessions[1].metadata["notes"] = "x" * 200_000

    def send(child):
        child.stdin.write(frame_with_bodies(False, sessions[:2]))
        child.stdin.write(frame((False, [item(2, sessions[2])])))

    assert [seq for acks in writer_answers(path, send) for seq in acks] == [0, 1, 2]
    with open_trace_store(path) as store:
        for session in sessions:
            assert_same(store.get_session(session.session_id).to_dict(), session.to_dict())


@pytest.mark.parametrize("more_coming", [False, True])
def test_the_writer_commits_what_it_has_at_once(tmp_path, more_coming):
    # Its answer comes with no second frame sent, even told that more are coming: the
    # server holds what comes meanwhile until this answer (group commit without a wait).
    def send(child):
        child.stdin.write(frame((more_coming, [item(seq, make_session(seq))
                                               for seq in range(3)])))
        child.stdin.flush()
        assert select.select([child.stdout], [], [], 30)[0], "no answer in 30 s"
        child.stdin.write(frame((False, [item(seq, make_session(seq)) for seq in range(3, 6)])))

    assert writer_answers(tmp_path / "t.db", send) == [[0, 1, 2], [3, 4, 5]]


def test_checkpoints_start_the_wal_over_once_it_is_big_and_a_reader_never_holds_them_up(
        tmp_path):
    # Round by round, as the writer child's checkpoint thread runs them. Under a steady
    # stream of commits SQLite never starts the WAL over by itself; a round does once it
    # holds the threshold, unless a reader is still on it: then it gives up at once and a
    # later round tries again.
    path = tmp_path / "t.db"
    wal = Path(f"{path}-wal")
    store = TraceStore(parse_trace_db(str(path)), writer_process=False)
    db = store.database
    written = 0

    def write_until(wal_bytes: int) -> None:
        nonlocal written
        while not wal.exists() or wal.stat().st_size < wal_bytes:
            store.write_session_sync(make_session(written))
            written += 1

    def grows_when_written(sessions: int = 3) -> bool:
        nonlocal written
        size = wal.stat().st_size
        for _ in range(sessions):
            store.write_session_sync(make_session(written))
            written += 1
        return wal.stat().st_size > size

    reader = sqlite3.connect(path, isolation_level=None)
    try:
        write_until(1 << 20)
        assert db.checkpoint(restart_after_bytes=4 << 20) == "passive"  # not big yet
        write_until(2 << 20)
        assert db.checkpoint(restart_after_bytes=1 << 20) == "restart"
        assert not grows_when_written()  # started over: the file is written from its start
        write_until(wal.stat().st_size + 1)  # more frames than the threshold again
        reader.execute("BEGIN")  # a long read, on the WAL as it is now
        reader.execute("SELECT COUNT(*) FROM session_traces").fetchone()
        assert db.checkpoint(restart_after_bytes=1 << 20) == "busy"  # gave up, did not wait
        assert grows_when_written()  # commits go on while the reader holds the WAL
        reader.execute("COMMIT")
        assert db.checkpoint(restart_after_bytes=1 << 20) == "restart"
        assert not grows_when_written()
    finally:
        reader.close()
        store.close()
    check = sqlite3.connect(path)
    assert check.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert check.execute("SELECT COUNT(*) FROM session_traces").fetchone()[0] == written


def test_the_checkpoint_thread_starts_a_big_wal_over_once_commits_leave_it_a_moment(
        tmp_path):
    # SQLite's own checkpoints are off (they would run inside a commit): the thread's rounds
    # are what bound the WAL. A round needs the write lock for a moment between commits.
    path = tmp_path / "t.db"
    wal = Path(f"{path}-wal")
    store = TraceStore(parse_trace_db(str(path)), writer_process=False)
    store.database.checkpoint_in_background(every_s=0.01, restart_after_bytes=1 << 20)
    written = 0

    def grows_when_written() -> bool:
        nonlocal written
        size = wal.stat().st_size
        for _ in range(3):
            store.write_session_sync(make_session(written))
            written += 1
        return wal.stat().st_size > size

    try:
        while not wal.exists() or wal.stat().st_size < 4 << 20:
            store.write_session_sync(make_session(written))
            written += 1
        deadline = time.monotonic() + 10
        while grows_when_written():
            assert time.monotonic() < deadline, "no round started the WAL over"
            time.sleep(0.05)  # a moment without commits
    finally:
        store.close()


def test_the_writer_exits_when_the_server_is_killed(tmp_path, mock_policy, api_key):
    path = tmp_path / "traces.db"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-c", SERVER_SCRIPT, str(path), api_key,
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            cwd=str(Path(__file__).resolve().parents[1]))
    try:
        wait_until_up(url, proc)
        bodies = [rollout_body(f"run-{i}", i, mock_policy.url + "/v1") for i in range(20)]
        assert all(s == 200 for _, s in asyncio.run(fire(url, api_key, bodies)))
        (writer,) = writer_children(proc.pid)  # started with the server
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 15
        while alive(writer) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(writer), "the writer outlived its server"
    finally:
        if proc.poll() is None:
            proc.kill()
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT COUNT(*) FROM session_traces").fetchone()[0] == 20
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_scripts_blocking_writes_and_in_memory_stores_use_the_thread(tmp_path):
    before = writer_children(os.getpid())  # other tests' children, exiting
    with open_trace_store(tmp_path / "t.db") as store:
        store.write_session_sync(make_session(0))
        asyncio.run(store.write_session(make_session(1)))  # a loop that did not opt in
        assert not writer_children(os.getpid()) - before
        assert store.count_sessions() == 2
    with TraceStore(parse_trace_db(":memory:")) as memory:
        asyncio.run(memory.write_session(make_session(1)))
        assert memory.count_sessions() == 1


# -- ids and batch SQL ------------------------------------------------------------------------


def test_session_ids_are_time_ordered_and_keep_their_shape():
    ids = []
    started_ms = time.time_ns() // 1_000_000
    for _ in range(60):  # across many milliseconds, and several ids in some of them
        ids.append(SessionTracer().session_id)
        if len(ids) % 3 == 0:
            time.sleep(0.002)
    ended_ms = time.time_ns() // 1_000_000
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    # ids made in a later millisecond sort later: the id indexes grow at their right edge,
    # even within one second
    millis = [int(i[:11], 16) for i in ids]
    assert millis == sorted(millis) and millis[-1] - millis[0] >= 20
    assert started_ms <= millis[0] and millis[-1] <= ended_ms


def test_a_batch_is_one_cached_statement_a_table_with_parent_ids_in_the_rows(tmp_path):
    store = TraceStore(parse_trace_db(str(tmp_path / "t.db")), writer_process=False)
    seen = statements_run(store)
    for size in (1, 3, 7):
        batch = [make_session(100 * size + i) for i in range(size)]
        store.write_sessions_sync(batch)
    inserts = [sql for sql in seen if sql.startswith("INSERT INTO events")]
    assert inserts and len({sql.split(" VALUES ")[0] for sql in inserts}) == 1
    assert not [sql for sql in seen if sql.startswith("INSERT") and "SELECT id FROM "
                "session_timesteps" in sql], "children must not look their parents up per row"
    # and the ids are right: every event and message sits under its own session's timestep
    conn = sqlite3.connect(tmp_path / "t.db")
    for table in ("events", "messages"):
        wrong = conn.execute(f"SELECT COUNT(*) FROM {table} x JOIN session_timesteps t ON "
                             "t.id = x.timestep_id WHERE t.session_id != x.session_id"
                             ).fetchone()[0]
        orphans = conn.execute(f"SELECT COUNT(*) FROM {table} WHERE timestep_id NOT IN "
                               "(SELECT id FROM session_timesteps)").fetchone()[0]
        assert (wrong, orphans) == (0, 0)
    store.close()


def test_a_batch_of_new_sessions_is_inserted_without_asking_which_are_stored(tmp_path):
    # A rollout's session is new; the stored ids are looked up only for a batch whose insert
    # failed (a rewrite among them), which then lands whole: new sessions stored, the same
    # content again a success, other content a conflict alone.
    store = TraceStore(parse_trace_db(str(tmp_path / "t.db")), writer_process=False)
    seen = statements_run(store)
    stored = make_session(1)
    store.write_sessions_sync([stored, make_session(2)])
    assert seen and not [sql for sql in seen if "session_id IN" in sql]
    changed = copy.deepcopy(stored)
    changed.metadata["seed"] = 99
    fresh = [make_session(3), make_session(4)]

    async def batch() -> list:
        return await asyncio.gather(*(store.write_session(s) for s in (
            fresh[0], copy.deepcopy(stored), changed, fresh[1])), return_exceptions=True)

    outcomes = asyncio.run(batch())
    assert [type(o).__name__ for o in outcomes] == [
        "NoneType", "NoneType", "SessionConflictError", "NoneType"]
    assert [sql for sql in seen if "session_id IN" in sql]
    assert store.count_sessions() == 4
    assert store.get_session(stored.session_id).metadata == stored.metadata
    store.close()


def test_a_batch_writes_its_wal_frames_and_little_else(tmp_path):
    # A row's statement journal holds the pages earlier rows of its transaction changed; as
    # a temporary file it was most of what a batch wrote (and no part of durability).
    store = TraceStore(parse_trace_db(str(tmp_path / "t.db")), writer_process=False)

    def commit(sessions: list) -> None:
        store.write_sessions_sync(sessions)

    def written() -> int:
        return int(Path("/proc/self/io").read_text().split("wchar:")[1].split()[0])

    commit([make_session(i) for i in range(100)])
    sqlite3.connect(tmp_path / "t.db").execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    before = written()
    commit([make_session(i) for i in range(100, 124)])
    wal_bytes, total = (tmp_path / "t.db-wal").stat().st_size, written() - before
    store.close()
    assert wal_bytes > 0 and total < 1.2 * wal_bytes, (total, wal_bytes)


def test_ids_stay_right_when_another_writer_adds_rows_between_batches(tmp_path):
    path = tmp_path / "t.db"
    with open_trace_store(path) as store:
        store.write_session_sync(make_session(0))
    other = sqlite3.connect(path, isolation_level=None)  # synth-ai's tracer, say
    other.execute("INSERT INTO session_traces (session_id, created_at, num_timesteps, "
                  "num_events, num_messages, metadata) VALUES ('theirs', '2025-01-01 "
                  "00:00:00', 1, 0, 1, '{}')")
    other.execute("INSERT INTO session_timesteps (session_id, step_id, step_index) VALUES "
                  "('theirs', 's', 0)")
    other.execute("INSERT INTO messages (session_id, timestep_id, message_type, content) "
                  "VALUES ('theirs', last_insert_rowid(), 'user', 'hello')")
    other.close()
    mine = make_session(1)
    with open_trace_store(path) as store:
        asyncio.run(store.write_session(mine))
        loaded = store.get_session(mine.session_id)
        assert [m.content for m in loaded.messages] == [m.content for m in mine.messages]
        assert [m.content for m in store.get_session("theirs").messages] == ["hello"]


# -- reads ------------------------------------------------------------------------------------


def test_show_finds_a_prefix_by_seeking_the_key_in_any_case(tmp_path):
    with open_trace_store(tmp_path / "t.db") as store:
        sessions = [make_session(i) for i in range(3)]
        for s in sessions:
            store.write_session_sync(s)
        seen = statements_run(store)
        target = sessions[1].session_id
        assert store.get_session(target[:20]).session_id == target
        assert store.get_session(target[:20].upper()).session_id == target
        assert not [sql for sql in seen if "LIKE" in sql], "a prefix must not scan the table"
        with pytest.raises(SessionNotFoundError, match="several"):
            store.get_session(target[:8])  # the same second
        with pytest.raises(SessionNotFoundError, match="no session"):
            store.get_session("zz")


def test_stats_come_from_running_totals_that_every_writer_keeps_right(tmp_path):
    path = tmp_path / "t.db"
    with open_trace_store(path) as store:
        for i in range(12):
            store.write_session_sync(make_session(i, app="math" if i % 3 else "other",
                                                  status="error" if i % 5 == 0 else "ok",
                                                  reward=i / 10))
    raw = sqlite3.connect(path, isolation_level=None)  # another writer: insert, rewrite, delete
    raw.execute("INSERT INTO session_traces (session_id, created_at, num_timesteps, num_events,"
                " num_messages, metadata) VALUES ('theirs', '2025-01-01 00:00:00', 2, 0, 3, "
                "'{\"app_id\": \"synth\", \"duration_s\": 1.5}')")
    raw.execute("UPDATE session_traces SET metadata = '{\"app_id\": \"synth\", \"status\": "
                "\"error\", \"duration_s\": 2.5}' WHERE session_id = 'theirs'")
    raw.execute("DELETE FROM session_traces WHERE run_id = 'run-4'")
    raw.execute("INSERT INTO events (session_id, event_type, model_name, input_tokens, "
                "output_tokens, cost_usd, latency_ms) VALUES ('theirs', 'cais', 'gpt', 10, 5, "
                "3, 100)")  # synth-ai's cost is in cents
    raw.execute("DELETE FROM events WHERE id = (SELECT MIN(id) FROM events)")
    raw.close()
    with open_trace_store(path, read_only=True) as store:
        seen = statements_run(store)
        totals = store.stats()
        assert not [sql for sql in seen if "FROM session_traces s" in sql or
                    "GROUP BY" in sql], "stats must read the totals, not sum the rows"
        store.database.schema_version = 4  # what a file without the totals gets: the rows summed
        summed = store.stats()
    assert totals.to_dict() == summed.to_dict()
    # math: sessions 1, 2, 5, 7, 8, 10, 11 (4 deleted), errors 5 and 10, rewards i/10
    assert totals.sessions == 12 and totals.by_app[0] == {
        "app_id": "math", "sessions": 7, "errors": 2, "mean_reward": pytest.approx(4.4 / 7)}
    assert totals.ledger.wall_s == pytest.approx(2.5)
    # 24 LM calls at $0.001 (the deleted session's stay), one deleted, 3 cents of synth-ai's
    assert totals.cost_usd == pytest.approx(24 * 0.001 - 0.001 + 0.03)


def test_filter_values_come_from_the_totals_as_every_writer_leaves_them(tmp_path):
    path = tmp_path / "t.db"
    with open_trace_store(path) as store:
        for i in range(6):
            store.write_session_sync(make_session(i, app="math" if i % 3 else "other"))
    raw = sqlite3.connect(path, isolation_level=None)  # synth-ai: insert, then the metadata
    raw.execute("INSERT INTO session_traces (session_id, created_at, num_timesteps, num_events,"
                " num_messages, metadata) VALUES ('theirs', '2025-01-01 00:00:00', 2, 0, 3, "
                "'{\"app_id\": \"synth\"}')")
    raw.execute("UPDATE session_traces SET metadata = '{\"app_id\": \"synth\", \"mode\": "
                "\"eval\", \"model\": \"gpt\"}' WHERE session_id = 'theirs'")

    def choices_both_ways() -> tuple[dict, dict]:
        with open_trace_store(path, read_only=True) as store:
            seen = statements_run(store)
            kept = filter_choices(store)
            assert not [sql for sql in seen if "FROM session_traces" in sql and any(
                column in sql for column in ("app_id", "model_name", "mode", "split"))], \
                "the values must come from the totals"
            store.database.schema_version = 7  # an older file's: its rows, seeked or scanned
            return kept, filter_choices(store)

    kept, from_rows = choices_both_ways()
    assert kept == from_rows and kept["app"] == ["math", "other", "synth"]
    assert "eval" in kept["mode"] and "gpt" in kept["model"]
    raw.execute("DELETE FROM session_traces WHERE app_id = 'other'")
    raw.execute("UPDATE session_traces SET metadata = '{\"app_id\": \"synth\", \"model\": "
                "\"gpt-2\"}' WHERE session_id = 'theirs'")
    raw.execute("UPDATE session_traces SET mode = 'rl' WHERE session_id = 'theirs'")  # alone
    raw.close()
    kept, from_rows = choices_both_ways()
    assert kept == from_rows and kept["app"] == ["math", "synth"]
    assert "eval" not in kept["mode"] and "gpt" not in kept["model"] and "gpt-2" in kept["model"]


V6_DUMP = Path(__file__).parent / "data" / "schema_v6.sql"


def load_version_6(path: Path, *, back_to_5: bool = False) -> None:
    """The file the release before schema 7 wrote (see the dump's header); ``back_to_5``
    undoes what version 6 added (the events count in the totals)."""
    raw = sqlite3.connect(path, isolation_level=None)
    raw.executescript(V6_DUMP.read_text())
    if back_to_5:
        for (trigger,) in raw.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' "
                                      "AND name LIKE 'synth_deploy_totals_%'").fetchall():
            raw.execute(f"DROP TRIGGER {trigger}")
        raw.execute("ALTER TABLE synth_deploy_session_totals DROP COLUMN events")
        raw.execute("DELETE FROM synth_deploy_schema WHERE version = 6")
    raw.close()


def index_sql(path: Path, name: str) -> str:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (name,)).fetchone()[0]
    finally:
        conn.close()


V6_FILTERS = [SessionFilter(), SessionFilter(mode="eval"), SessionFilter(mode="train"),
              SessionFilter(split="test"), SessionFilter(split="train", status="ok"),
              SessionFilter(app="synth")]


def test_a_version_6_file_keeps_its_answers_with_mode_split_and_duration_as_columns(tmp_path,
                                                                                  caplog):
    with open_trace_store(tmp_path / "new.db"):
        assert "upgrading" not in caplog.text  # a new store is made, not upgraded
    path = tmp_path / "v6.db"
    load_version_6(path)
    with open_trace_store(path, read_only=True) as store:  # read as it is: from the metadata
        assert store.schema_version == 6
        pages = [browse_sessions(store, f, limit=50).to_dict() for f in V6_FILTERS]
        stats = store.stats().to_dict()
    assert "json_extract" in index_sql(path, "idx_session_mode_glance")
    with open_trace_store(path) as store:
        assert store.schema_version == SCHEMA_VERSION
        assert f"upgrading its trace schema from v6 to v{SCHEMA_VERSION}, once" in caplog.text
        migrated = [browse_sessions(store, f, limit=50).to_dict() for f in V6_FILTERS]
        assert store.stats().to_dict() == stats
        # Values the metadata held as other types than text: a mode of 3 is found as "3";
        # a duration written as "2.0" reads as 2.0 (the viewer showed none).
        [odd] = browse_sessions(store, SessionFilter(mode="3")).rows
        assert (odd.run_id, odd.split) == ("run-3", '{"name":"odd"}')
        [as_text] = browse_sessions(store, SessionFilter(run_id="run-2")).rows
        assert as_text.duration_s == 2.0
    odd_ones = {"run-2", "run-3"}
    for before, after in zip(pages, migrated, strict=True):
        assert [r for r in after["rows"] if r["run_id"] not in odd_ones] == \
            [r for r in before["rows"] if r["run_id"] not in odd_ones]
        assert after["total"] == before["total"]
    assert "theirs" in [r["session_id"] for r in migrated[1]["rows"]]  # synth-ai's row
    raw = sqlite3.connect(path, isolation_level=None)
    assert raw.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    # The per-filter indexes (on the metadata, here) are gone: the glance index holds them.
    assert {name for (name,) in raw.execute(
        "SELECT name FROM sqlite_master WHERE name LIKE 'idx_session_%'")} == {
        "idx_session_glance", "idx_session_run", "idx_session_reward"}
    plan = " ".join(r[3] for r in raw.execute(
        "EXPLAIN QUERY PLAN SELECT COUNT(*) FROM session_traces WHERE split = 'test'"))
    assert "COVERING INDEX idx_session_glance" in plan
    # synth-ai keeps writing into the migrated file: its new rows get the columns too
    raw.execute("INSERT INTO session_traces (session_id, created_at, num_timesteps, num_events,"
                " num_messages, metadata) VALUES ('later', '2025-10-10T09:00:00', 1, 0, 2, "
                "'{\"app_id\": \"synth\"}')")
    raw.execute("UPDATE session_traces SET metadata = '{\"app_id\": \"synth\", \"mode\": "
                "\"eval\", \"duration_s\": 1.5}' WHERE session_id = 'later'")
    raw.close()
    with open_trace_store(path, read_only=True) as store:
        assert browse_sessions(store, SessionFilter(mode="eval")).total == \
            migrated[1]["total"] + 1
        assert store.stats().ledger.wall_s == pytest.approx(stats["ledger"]["wall_s"] + 1.5)


def test_a_version_5_file_gets_totals_that_count_events(tmp_path):
    path = tmp_path / "v5.db"
    load_version_6(path, back_to_5=True)
    with open_trace_store(path, read_only=True) as store:  # summed from the rows
        expected = store.stats().to_dict()
    with open_trace_store(path) as store:
        assert store.schema_version == SCHEMA_VERSION and store.stats().to_dict() == expected
        store.write_session_sync(make_session(9))  # the rebuilt triggers keep counting
        assert store.stats().events == expected["events"] + 4  # two turns, two events each


ODD_METADATA = [{"mode": 3, "duration_s": "2.0"}, {"mode": True, "duration_s": 2**70},
                {"mode": {"a": [1, 2]}, "duration_s": [1]}, {"mode": None, "duration_s": 1},
                {"mode": "eval", "duration_s": float("nan")}, {"mode": 2**70},
                {"request": {"env": {"config": {"split": 7.5}}}},
                {"request": {"env": "no config"}}, {"request": [1]},
                {"mode": (1, "a"), "duration_s": datetime(2025, 1, 2, 3, 4, 5)}]


def test_our_writer_fills_the_columns_as_the_triggers_fill_other_writers_rows(tmp_path):
    path = tmp_path / "t.db"
    with open_trace_store(path) as store:
        for i, metadata in enumerate(ODD_METADATA):
            tracer = SessionTracer(session_id=f"ours-{i}", metadata=metadata)
            store.write_session_sync(tracer.finish())
    raw = sqlite3.connect(path, isolation_level=None)
    # The same metadata text, inserted as synth-ai does (no columns, no status)
    raw.execute("INSERT INTO session_traces (session_id, created_at, num_timesteps, "
                "num_events, num_messages, metadata) SELECT 'theirs-' || substr(session_id, "
                "6), created_at, 0, 0, 0, metadata FROM session_traces")
    pairs = raw.execute(
        "SELECT o.session_id, o.mode, t.mode, o.split, t.split, o.duration_s, t.duration_s "
        "FROM session_traces o JOIN session_traces t ON t.session_id = 'theirs-' || "
        "substr(o.session_id, 6) WHERE o.session_id LIKE 'ours-%' ORDER BY 1").fetchall()
    raw.close()
    assert len(pairs) == len(ODD_METADATA)
    for sid, *values in pairs:
        if sid == "ours-4":  # NaN: text SQLite's JSON cannot read, values our writer knows
            assert values == ["eval", None, None, None, None, None]
        else:
            assert values[0::2] == values[1::2], sid
    assert pairs[0][1:] == ("3", "3", None, None, 2.0, 2.0)


# -- export -----------------------------------------------------------------------------------


def tool_session():
    tracer = SessionTracer(metadata={"app_id": "tools", "status": "ok", "seed": "s-1"})
    tracer.start_timestep("t1", turn_number=1)
    tracer.record_chat([{"role": "user", "content": "add 1 and 2"}])
    tracer.record_lm_call(model_name="m", call_records=[{"request": {"tools": [
        {"type": "function", "function": {"name": "add", "parameters": {}}}]}}])
    tracer.record_chat([{"role": "user", "content": "add 1 and 2"}, {
        "role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}]}])
    tracer.record_message("tool_result", {"sum": 3}, {"tool_call_id": "c1"})
    tracer.record_message("assistant", "3")
    return tracer.finish()


@pytest.mark.slow
def test_export_streams_in_pages_and_writes_what_each_session_holds(tmp_path):
    path = tmp_path / "t.db"
    with open_trace_store(path) as store:
        for i in range(1100):
            store.write_session_sync(make_session(i, reward=i % 2))
        store.write_session_sync(tool_session())
    raw = sqlite3.connect(path, isolation_level=None)  # a message with no timestep
    sid = raw.execute("SELECT session_id FROM session_traces LIMIT 1").fetchone()[0]
    raw.execute("INSERT INTO messages (session_id, timestep_id, message_type, content) VALUES "
                "(?, NULL, 'user', 'late'), (?, NULL, 'assistant', 'reply')", (sid, sid))
    raw.close()
    with open_trace_store(path, read_only=True) as store:
        ids = [s.session_id for s in store.list_sessions(limit=None, status="ok",
                                                        newest_first=False)]
        expected = [json.dumps(e, ensure_ascii=False) for sid in ids
                    for e in sft_examples(store.get_session(sid))]
        seen = statements_run(store)
        pages = []
        result = export_sft(store, tmp_path / "out.jsonl",
                            progress=lambda done, total: pages.append((done, total)))
    assert (tmp_path / "out.jsonl").read_text().splitlines() == expected
    assert result.examples == len(expected) and any('"tools"' in e for e in expected)
    assert pages[-1] == (len(ids), len(ids)) and len(pages) == 3  # 500 sessions a page
    # a few queries a page (not six a session, as a session at a time took)
    assert len([sql for sql in seen if sql.startswith("SELECT")]) <= 6 * len(pages) + 2


def test_the_export_command_shows_progress_on_a_terminal_only(tmp_path):
    path = tmp_path / "t.db"
    with open_trace_store(path) as store:
        for i in range(5):
            store.write_session_sync(make_session(i))
    command = [sys.executable, "-m", "synth_deploy.cli", "traces", "export", "--force",
               "--trace-db", str(path), "--out"]
    env = {**os.environ, "COLUMNS": "100"}
    piped = subprocess.run([*command, str(tmp_path / "a.jsonl")], capture_output=True,
                           text=True, env=env, timeout=120)
    assert piped.returncode == 0 and "exporting" not in piped.stderr
    leader, follower = os.openpty()
    proc = subprocess.Popen([*command, str(tmp_path / "b.jsonl")], stdout=subprocess.PIPE,
                            stderr=follower, env=env)
    os.close(follower)
    shown = b""
    while select.select([leader], [], [], 60)[0]:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        shown += chunk
    assert proc.wait(60) == 0
    assert b"exporting sessions" in shown and b"5/5" in shown
    assert (tmp_path / "a.jsonl").read_text() == (tmp_path / "b.jsonl").read_text()
