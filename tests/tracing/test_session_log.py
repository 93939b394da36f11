"""The session log: a store whose readers are elsewhere (a Modal container's) appends each
session whole to a file beside it, with no writer child and no rows; a reader takes whole
records only, and a failed write leaves none in part."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
import textwrap
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import pytest
from sessions import log_record, make_session

from synth_deploy.errors import TraceStoreError
from synth_deploy.tracing import (
    RolloutFacts,
    SessionLog,
    open_trace_store,
    parse_trace_db,
    read_session_log,
    session_log_files,
)

KEY = "sk-live-sessionlog-0123456789abcdef"


def _container_store(path):
    return open_trace_store(replace(parse_trace_db(str(path)), session_log=True))


def _records(path):
    return [record for _, file in session_log_files(path)
            for record in read_session_log(file).records]


def _counts(path) -> list[int]:
    with closing(sqlite3.connect(path)) as conn:
        return [conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
                for table in ("session_traces", "session_journal")]


def _facts(i: int) -> RolloutFacts:
    request = {"run_id": f"run-{i}", "env": {"seed": i},
               "policy": {"config": {"model": "mock", "api_key": KEY}}}
    return RolloutFacts({"app_id": "math", "run_id": f"run-{i}", "seed": i}, 0.25,
                        json.dumps(request).encode(), b'{"metrics": {"episode_rewards": [1]}}',
                        None)


def test_a_served_loop_appends_each_session_to_the_log_with_no_child_and_no_rows(tmp_path):
    # Alone on an idle loop or many at once, each session is one record, in the order
    # written, described by its rollout, its keys masked; nothing reaches the tables and no
    # writer child is started.
    path = tmp_path / "container.db"
    sessions = [make_session(i) for i in range(40)]

    async def write_all(store) -> None:
        assert store.use_writer_process() is None
        for i, session in enumerate(sessions[:3]):
            await store.write_session(session, _facts(i))
        await asyncio.gather(*(store.write_session(s, _facts(i))
                               for i, s in enumerate(sessions[3:], start=3)))

    with _container_store(path) as store:
        asyncio.run(write_all(store))
    with pytest.raises(TraceStoreError, match="closed"):  # and nothing reaches the log
        asyncio.run(store.write_session(make_session(99), _facts(99)))
    assert _counts(path) == [0, 0]
    records = _records(path)
    assert [r[0] for r in records] == [s.session_id for s in sessions]
    assert all(body and rollout for _, body, rollout in records)
    log_bytes = b"".join(file.read_bytes() for _, file in session_log_files(path))
    assert KEY.encode() not in log_bytes and b"run-39" in log_bytes


def test_a_session_the_log_cannot_hold_is_stored_in_rows(tmp_path):
    # Only what msgpack holds goes in a record; a session that carries an object of the
    # app's own class is stored in rows instead (the object as its str(), as rows keep it).
    class Handle:
        pass

    path = tmp_path / "container.db"
    plain, tagged = make_session(1), make_session(2)
    tagged.metadata["handle"] = Handle()
    with _container_store(path) as store:
        store.write_sessions_sync([plain, tagged])
    assert [r[0] for r in _records(path)] == [plain.session_id]
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT session_id FROM session_traces").fetchall() == [
            (tagged.session_id,)]


def test_files_follow_one_another_and_a_reader_takes_whole_records_only(tmp_path):
    store = tmp_path / "container.db"
    log = SessionLog(store, rotate_bytes=1)  # a new file after every record
    sessions = [make_session(i) for i in range(11)]
    for session in sessions:
        assert log.append(session)
    log.close()
    files = session_log_files(store)
    assert [n for n, _ in files] == list(range(1, 12))  # 10 after 9, not after 1
    assert [r[0] for r in _records(store)] == [s.session_id for s in sessions]
    # A record being written is seen in part: left for the next read, whole then.
    being_written = make_session(50)
    record = log_record(tmp_path, being_written)
    newest = files[-1][1]
    held = newest.read_bytes()
    newest.write_bytes(held + record[:40])
    read = read_session_log(newest)
    assert (len(read.records), read.end, read.size) == (1, len(held), len(held) + 40)
    with open(newest, "ab") as fh:
        fh.write(record[40:])
    assert [r[0] for r in read_session_log(newest, read.end).records] == [
        being_written.session_id]
    # A process started later writes after the files there.
    later = SessionLog(store)
    later.append(make_session(99))
    later.close()
    assert session_log_files(store)[-1][0] == 12


WRITE_PAST_A_FILE_SIZE_LIMIT = """
import json, resource, signal, sys
sys.path.insert(0, {tests!r})
import pytest
from sessions import log_record, make_session
from synth_deploy.errors import TraceStoreError
from synth_deploy.tracing import SessionLog

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
log = SessionLog({store!r})
failed, held = [], []
for i in range(8):
    session = make_session(i)
    try:
        log.append(session)
    except TraceStoreError as exc:
        failed.append((i, exc.message, exc.hint))
    else:
        held.append(session.session_id)
log.close()
print(json.dumps({{"failed": failed, "held": held}}))
"""


def test_a_write_that_fails_leaves_no_part_of_its_record_and_the_next_goes_on(tmp_path):
    # A disk that fills mid-record (here: a file-size limit, a real short write and then
    # EFBIG): the part written is cut off, and the next session goes to a new file.
    store = tmp_path / "container.db"
    code = WRITE_PAST_A_FILE_SIZE_LIMIT.format(
        tests=str(Path(__file__).parents[1]), limit=int(_record_size(tmp_path) * 2.5),
        store=str(store))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    told = json.loads(done.stdout)
    failed = told["failed"]
    assert [i for i, *_ in failed] == [2, 5]  # a third record does not fit in a file
    assert "cannot append session" in failed[0][1] and "disk space" in failed[0][2]
    for _, file in session_log_files(store):
        read = read_session_log(file)
        assert read.end == read.size  # whole records only
    assert [r[0] for r in _records(store)] == told["held"] and len(told["held"]) == 6
    assert len(session_log_files(store)) == 3


def _record_size(tmp_path) -> int:
    probe = tmp_path / "probe.db"
    log = SessionLog(probe)
    log.append(make_session(0))
    log.close()
    [(_, file)] = session_log_files(probe)
    return file.stat().st_size
