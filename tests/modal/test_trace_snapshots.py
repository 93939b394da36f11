"""VolumeSnapshots: a container's local store copied whole to its Volume file, then committed;
only when something changed; a failed commit costs nothing but a retry."""

from __future__ import annotations

import sqlite3
import threading

from sessions import make_session

from synth_deploy.modal import VolumeSnapshots
from synth_deploy.tracing import open_trace_store


def _count(path) -> int:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return conn.execute("SELECT COUNT(*) FROM session_traces").fetchone()[0]


def test_a_snapshot_is_whole_readable_alone_and_taken_only_after_a_change(tmp_path):
    local, target = tmp_path / "local.db", tmp_path / "volume" / "app" / "ta-1.db"
    commits = []
    with open_trace_store(local) as store:
        store.write_sessions_sync([make_session(i) for i in range(5)])
        snapshots = VolumeSnapshots(local, target, lambda: commits.append(_count(target)),
                                    every_s=3600)
        assert snapshots.snapshot() is True
        assert commits == [5]  # the commit saw the whole file, in place
        assert not list(target.parent.glob("*-wal")) and not list(target.parent.glob("*.partial"))
        assert snapshots.snapshot() is False and commits == [5]  # nothing new: no commit
        store.write_sessions_sync([make_session(i) for i in range(5, 8)])
        snapshots.stop()  # the drain: a last snapshot
    assert commits == [5, 8] and _count(target) == 8


def test_a_failed_commit_is_retried_by_the_next_snapshot(tmp_path, caplog):
    local, target = tmp_path / "local.db", tmp_path / "vol" / "ta-2.db"
    outcomes = [RuntimeError("Volume unreachable"), None]

    def commit():
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    with open_trace_store(local) as store:
        store.write_session_sync(make_session(1))
        snapshots = VolumeSnapshots(local, target, commit, every_s=3600)
        assert snapshots.snapshot() is False
        assert "Volume unreachable" in caplog.text
        assert snapshots.snapshot() is True and outcomes == []


def test_snapshots_taken_while_a_writer_commits_are_each_consistent(tmp_path):
    local, target = tmp_path / "local.db", tmp_path / "vol" / "ta-3.db"
    seen: list[int] = []
    with open_trace_store(local) as store:
        store.write_session_sync(make_session(0))
        snapshots = VolumeSnapshots(local, target, lambda: seen.append(_count(target)),
                                    every_s=3600)
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
    assert len(seen) >= 2 and seen == sorted(seen) and seen[-1] == 200
