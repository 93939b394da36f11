"""The session log: a store whose readers are elsewhere (a Modal container's) hands each
session whole to its log, with no writer child and no rows; the log holds the records until
a copier takes them, gives back those it could not copy, and refuses sessions once full; a
reader of a log file takes whole records only."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from contextlib import closing
from dataclasses import replace

import pytest
from sessions import log_record, make_session

from synth_deploy.errors import TraceStoreError
from synth_deploy.tracing import (
    RolloutFacts,
    SessionLog,
    open_trace_store,
    parse_trace_db,
    read_session_log,
    session_log,
    write_session_log,
)

KEY = "sk-live-sessionlog-0123456789abcdef"


def _container_store(path):
    return open_trace_store(replace(parse_trace_db(str(path)), session_log=True))


def _records(tmp_path, path):
    """What the copier would write of the log of the store at ``path``: its records, read
    back from the file."""
    file = tmp_path / "copy.log"
    write_session_log(file, session_log(path).take())
    return read_session_log(file).records


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
    records = _records(tmp_path, path)
    assert [r[0] for r in records] == [s.session_id for s in sessions]
    assert all(body and rollout for _, body, rollout in records)
    log_bytes = (tmp_path / "copy.log").read_bytes()
    assert KEY.encode() not in log_bytes and b"run-39" in log_bytes
    assert not (tmp_path / "container.db.sessions").exists()  # nothing on the disk


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
    assert [r[0] for r in _records(tmp_path, path)] == [plain.session_id]
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT session_id FROM session_traces").fetchall() == [
            (tagged.session_id,)]


def test_records_are_taken_once_in_order_and_those_given_back_come_first():
    # A copy that failed gives back what it took: the next copy has those first, then what
    # came since, each once.
    log = SessionLog()
    sessions = [make_session(i) for i in range(6)]
    for session in sessions[:3]:
        assert log.append(session)
    taken = log.take()
    assert log.take() == [] and log.held_bytes == 0
    for session in sessions[3:]:
        assert log.append(session)
    log.give_back(taken)
    assert log.held_bytes == sum(map(len, taken)) + sum(
        len(log_record(s)) for s in sessions[3:])
    assert log.take() == [*taken, *(log_record(s) for s in sessions[3:])]


def test_a_full_log_refuses_sessions_and_holds_them_again_once_copied(tmp_path):
    # The copies failing for a long while: the log stops growing, and the rollouts answer
    # an error rather than a 200 for a session it cannot keep.
    one = len(log_record(make_session(0)))
    log = SessionLog(limit_bytes=3 * one)
    for i in range(3):
        assert log.append(make_session(i))
    with pytest.raises(TraceStoreError, match="not yet copied to the trace Volume"):
        log.append(make_session(3))
    assert len(log.take()) == 3
    assert log.append(make_session(4))


def test_a_reader_takes_whole_records_and_tells_how_much_is_not_one(tmp_path):
    sessions = [make_session(i) for i in range(3)]
    path = tmp_path / "ta-1.1.log"
    write_session_log(path, [log_record(s) for s in sessions])
    whole = path.read_bytes()
    path.write_bytes(whole[:-10])  # a download cut short
    read = read_session_log(path)
    assert [r[0] for r in read.records] == [s.session_id for s in sessions[:2]]
    assert read.size - read.end == len(log_record(sessions[2])) - 10
    path.write_bytes(b"not a log")
    with pytest.raises(TraceStoreError, match="is not a session log"):
        read_session_log(path)


def test_a_store_and_its_copier_share_one_log_per_store_path(tmp_path):
    path = tmp_path / "container.db"
    assert session_log(path) is session_log(tmp_path / "." / "container.db")
    assert session_log(path) is not session_log(tmp_path / "other.db")
