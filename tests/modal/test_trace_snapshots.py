"""VolumeSnapshots: what a container's local store gained, copied into a new segment on its
Volume folder and committed; only when something changed; each segment a whole trace store
of its own; a failed commit costs nothing but a retry."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import closing

from sessions import make_session

from synth_deploy.modal import VolumeSnapshots
from synth_deploy.tracing import merge_trace_file, open_trace_store


def _ids(path) -> set[str]:
    """The sessions a segment holds, in rows or journaled; it must be whole alone."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return {row[0] for row in conn.execute(
            "SELECT session_id FROM session_traces UNION SELECT session_id FROM session_journal")}


def _segments(folder, container="ta-1"):
    return sorted(folder.glob(f"{container}.*.db"), key=lambda p: int(p.name.split(".")[1]))


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


def test_sessions_still_journaled_go_in_a_segment_once(tmp_path):
    # A busy writer child journals whole sessions and builds their rows later: a segment
    # taken meanwhile carries them as journal rows (a store opening the segment builds
    # them), and no later segment copies them again; once built, they come as rows.
    local, folder = tmp_path / "local.db", tmp_path / "vol"
    with open_trace_store(local) as store:
        store.write_session_sync(first := make_session(0))
    _journal(local, "j-1", "j-2")
    snapshots = VolumeSnapshots(local, folder, "ta-1", lambda: None, every_s=3600)
    assert snapshots.snapshot() is True
    _journal(local, "j-3")
    assert snapshots.snapshot() is True
    with sqlite3.connect(local) as conn:  # j-1's rows were built: it leaves the journal
        conn.execute("DELETE FROM session_journal WHERE session_id = 'j-1'")
    with open_trace_store(local) as store:
        store.write_session_sync(later := make_session(1))
    snapshots.stop()
    assert [_rows_and_journal(p) for p in _segments(folder)] == [
        ({first.session_id}, {"j-1", "j-2"}), (set(), {"j-3"}), ({later.session_id}, set())]


def test_journal_rows_given_a_seq_again_are_still_copied(tmp_path):
    # New journal rows are taken past the last one copied. When that row leaves the journal
    # (its rows built), SQLite may give its seq, and those after, to new rows: they must
    # reach a segment all the same (a session copied twice is stored once by the pull).
    local, folder = tmp_path / "local.db", tmp_path / "vol"
    open_trace_store(local).close()
    _journal(local, "j-1", "j-2")
    snapshots = VolumeSnapshots(local, folder, "ta-1", lambda: None, every_s=3600)
    assert snapshots.snapshot() is True
    with sqlite3.connect(local) as conn:
        conn.execute("DELETE FROM session_journal WHERE session_id = 'j-2'")
    _journal(local, "j-3", "j-4")  # seqs 2 and 3: j-3 takes j-2's
    assert snapshots.snapshot() is True
    _journal(local, "j-5")
    snapshots.stop()
    journaled = [_rows_and_journal(p)[1] for p in _segments(folder)]
    assert journaled[0] == {"j-1", "j-2"} and {"j-3", "j-4"} <= journaled[1]
    assert journaled[2] == {"j-5"}  # and the next takes only what is new again


def test_journal_rows_leave_the_container_once_committed_to_the_volume(tmp_path):
    # A container serving for hours must not keep every session on its disk: journal rows
    # in a committed segment are dropped; a failed commit keeps them until one succeeds.
    local, folder = tmp_path / "local.db", tmp_path / "vol"
    open_trace_store(local).close()
    fail = [True]

    def commit():
        if fail[0]:
            raise RuntimeError("Volume unreachable")

    snapshots = VolumeSnapshots(local, folder, "ta-1", commit, every_s=3600)
    _journal(local, "j-1", "j-2")
    assert snapshots.snapshot() is False  # written, not committed
    assert _local_journal(local) == {"j-1", "j-2"}
    fail[0] = False
    _journal(local, "j-3")
    assert snapshots.snapshot() is True
    assert _local_journal(local) == set()
    _journal(local, "j-4")
    snapshots.stop()
    assert _local_journal(local) == set()
    journaled = [_rows_and_journal(p)[1] for p in _segments(folder)]
    assert journaled == [{"j-1", "j-2"}, {"j-3"}, {"j-4"}]  # each once, in its own


def _local_journal(path) -> set[str]:
    with closing(sqlite3.connect(path)) as conn:
        return {r[0] for r in conn.execute("SELECT session_id FROM session_journal")}


def _journal(path, *session_ids: str) -> None:
    # Rows as a journaling writer child adds them (their bodies do not matter here).
    with sqlite3.connect(path) as conn:
        conn.executemany("INSERT INTO session_journal (session_id, body) VALUES (?, ?)",
                         [(sid, b"-") for sid in session_ids])


def _rows_and_journal(path) -> tuple[set[str], set[str]]:
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
