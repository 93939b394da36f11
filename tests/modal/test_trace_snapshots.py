"""VolumeSnapshots: what a container's local store gained, copied into a new segment on its
Volume folder and committed; only when something changed; each segment a whole trace store
of its own; a failed commit costs nothing but a retry."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from contextlib import closing
from dataclasses import replace

from sessions import make_session

from synth_deploy.modal import VolumeSnapshots
from synth_deploy.tracing import (
    merge_trace_file,
    open_trace_store,
    parse_trace_db,
    read_session_log,
)


def _ids(path) -> set[str]:
    """The sessions a segment holds, in rows or journaled; it must be whole alone."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return {row[0] for row in conn.execute(
            "SELECT session_id FROM session_traces UNION SELECT session_id FROM session_journal")}


def _segments(folder, container="ta-1"):
    """The container's files (SQLite segments and log copies), in the order written."""
    return sorted(folder.glob(f"{container}.*.*"), key=lambda p: int(p.name.split(".")[1]))


def test_each_snapshot_is_a_new_segment_of_what_is_new_readable_alone(tmp_path):
    local, folder = tmp_path / "local.db", tmp_path / "volume" / "app"
    commits: list[list[str]] = []
    with open_trace_store(local) as store:
        store.write_sessions_sync([make_session(i) for i in range(5)])
        snapshots = VolumeSnapshots(local, folder, "ta-1",
                                    lambda: commits.append([p.name for p in _segments(folder)]),
                                    every_s=3600)
        assert snapshots.snapshot() is True
        assert commits == [["ta-1.1.db"]]  # the commit saw the segment whole, in place
        assert not list(folder.glob("*-wal")) and not list(folder.glob("*.partial"))
        assert snapshots.snapshot() is False and len(commits) == 1  # nothing new: no commit
        store.write_sessions_sync([make_session(i) for i in range(5, 8)])
        snapshots.stop()  # the drain: a last segment
    first, second = _segments(folder)
    assert len(_ids(first)) == 5 and len(_ids(second)) == 3  # the second holds only the new
    with open_trace_store(local, read_only=True) as store:
        every = {s.session_id for s in store.list_sessions(limit=100)}
    assert _ids(first) | _ids(second) == every
    # A segment is a trace store: merged, its sessions come back whole.
    home = tmp_path / "home.db"
    with open_trace_store(home) as pulled, open_trace_store(local, read_only=True) as source:
        assert merge_trace_file(pulled, second).added == 3
        for session_id in _ids(second):
            assert pulled.get_session(session_id).to_dict() == \
                source.get_session(session_id).to_dict()


class _Handle:
    """An object of the app's own class: no msgpack type holds it, so a session that
    carries one is stored in rows, not in the log."""


def _container_store(path):
    return open_trace_store(replace(parse_trace_db(str(path)), session_log=True))


def test_the_session_log_goes_in_segments_each_session_once(tmp_path):
    # A container's store hands each session to its log: a copy carries the records held
    # since the last, and a segment a session stored in rows as rows; no later file copies
    # either again.
    local, folder = tmp_path / "local.db", tmp_path / "vol"
    sessions = [make_session(i) for i in range(5)]
    sessions[2].metadata["handle"] = _Handle()
    ids = [s.session_id for s in sessions]
    store = _container_store(local)
    store.write_sessions_sync(sessions[:2])
    snapshots = VolumeSnapshots(local, folder, "ta-1", lambda: None, every_s=3600)
    assert snapshots.snapshot() is True
    assert snapshots.snapshot() is False  # nothing new
    store.write_sessions_sync(sessions[2:4])
    assert snapshots.snapshot() is True
    store.write_sessions_sync(sessions[4:])
    store.close()
    snapshots.stop()
    assert [(p.suffix, *_rows_and_journal(p)) for p in _segments(folder)] == [
        (".log", set(), {ids[0], ids[1]}), (".log", set(), {ids[3]}),
        (".db", {ids[2]}, set()), (".log", set(), {ids[4]})]


def test_a_copy_that_fails_gives_its_records_back_for_the_next(tmp_path, caplog):
    # The Volume's folder cannot be written: the records taken go back to the log, and the
    # next snapshot copies them, with what came since, each once.
    local, folder = tmp_path / "local.db", tmp_path / "vol"
    sessions = [make_session(i) for i in range(3)]
    store = _container_store(local)
    store.write_sessions_sync(sessions[:2])
    folder.write_bytes(b"")  # a file where the folder should be
    snapshots = VolumeSnapshots(local, folder, "ta-1", lambda: None, every_s=3600)
    assert snapshots.snapshot() is False
    assert "trace snapshot to" in caplog.text
    folder.unlink()
    store.write_sessions_sync(sessions[2:])
    store.close()
    snapshots.stop()
    assert [_rows_and_journal(p)[1] for p in _segments(folder)] == [
        {s.session_id for s in sessions}]


def test_a_failed_commit_keeps_the_copy_and_commits_it_with_the_next(tmp_path):
    # The copy is in the Volume's folder (the container's view of it) once taken: a commit
    # that fails takes it along next time, and nothing is copied twice.
    local, folder = tmp_path / "local.db", tmp_path / "vol"
    sessions = [make_session(i) for i in range(3)]
    store = _container_store(local)
    commits: list[list[str]] = []
    fail = [True]

    def commit():
        if fail[0]:
            raise RuntimeError("Volume unreachable")
        commits.append([p.name for p in _segments(folder)])

    snapshots = VolumeSnapshots(local, folder, "ta-1", commit, every_s=3600)
    store.write_sessions_sync(sessions[:2])
    assert snapshots.snapshot() is False  # written, not committed
    fail[0] = False
    assert snapshots.snapshot() is False  # nothing new: the earlier copy committed
    store.write_sessions_sync(sessions[2:])
    store.close()
    snapshots.stop()
    assert commits == [["ta-1.1.log"], ["ta-1.1.log", "ta-1.2.log"]]
    assert [_rows_and_journal(p)[1] for p in _segments(folder)] == [
        {sessions[0].session_id, sessions[1].session_id}, {sessions[2].session_id}]


def _rows_and_journal(path) -> tuple[set[str], set[str]]:
    """The sessions a file holds in rows, and whole (a log copy's records, or journal
    rows)."""
    if path.suffix == ".log":
        return set(), {session_id for session_id, _, _ in read_session_log(path).records}
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return ({r[0] for r in conn.execute("SELECT session_id FROM session_traces")},
                {r[0] for r in conn.execute("SELECT session_id FROM session_journal")})


def test_a_failed_commit_is_retried_by_the_next_snapshot_with_nothing_lost(tmp_path, caplog):
    local, folder = tmp_path / "local.db", tmp_path / "vol"
    outcomes = [RuntimeError("Volume unreachable"), None]

    def commit():
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    with open_trace_store(local) as store:
        store.write_session_sync(make_session(1))
        snapshots = VolumeSnapshots(local, folder, "ta-2", commit, every_s=3600)
        assert snapshots.snapshot() is False
        assert "Volume unreachable" in caplog.text
        # Nothing new since: the segment written stays, and this time it is committed.
        assert snapshots.snapshot() is False and outcomes == []
    assert [p.name for p in _segments(folder, "ta-2")] == ["ta-2.1.db"]


def test_a_restarted_process_numbers_its_segments_after_those_there(tmp_path):
    local, folder = tmp_path / "local.db", tmp_path / "vol"
    folder.mkdir()
    (folder / "ta-4.7.db").write_bytes(b"")  # an earlier process's, same container id
    with open_trace_store(local) as store:
        store.write_session_sync(make_session(1))
    VolumeSnapshots(local, folder, "ta-4", lambda: None, every_s=3600).stop()
    assert (folder / "ta-4.8.db").exists()


def test_segments_taken_while_a_writer_commits_hold_every_session_once_in_all(tmp_path):
    local, folder = tmp_path / "local.db", tmp_path / "vol"
    with open_trace_store(local) as store:
        store.write_session_sync(make_session(0))
        snapshots = VolumeSnapshots(local, folder, "ta-3", lambda: None, every_s=3600)
        done = threading.Event()

        def write():
            for i in range(1, 200):
                store.write_session_sync(make_session(i))
            done.set()

        writer = threading.Thread(target=write)
        writer.start()
        while not done.is_set():
            snapshots.snapshot()
        writer.join()
        snapshots.stop()
    held = [_ids(p) for p in _segments(folder, "ta-3")]
    assert len(held) >= 2
    assert sum(map(len, held)) == 200 and len(set().union(*held)) == 200


def test_a_session_marked_lost_again_goes_in_a_new_segment(tmp_path):
    # A second lost answer of the same session replaces the first mark: it is news, and a
    # segment carries it (the copier knows new marks by their place in the table).
    local, folder = tmp_path / "local.db", tmp_path / "vol"
    session = make_session(1)
    store = _container_store(local)
    store.write_session_sync(session)
    snapshots = VolumeSnapshots(local, folder, "ta-1", lambda: None, every_s=3600)
    errors = [{"code": "client_gone", "message": "first"},
              {"code": "client_gone", "message": "second"}]
    said = []
    for error in errors:
        asyncio.run(store.record_lost_answer(session.session_id, error))
        assert snapshots.snapshot() is True
        [newest] = _segments(folder)[-1:]
        with closing(sqlite3.connect(f"file:{newest}?mode=ro", uri=True)) as conn:
            said += [json.loads(e)["message"] for (e,) in conn.execute(
                "SELECT error FROM session_amendments")]
    store.close()
    snapshots.stop()
    assert said == ["first", "second"]
