"""The journal: a busy writer child stores whole sessions first and builds their rows later.

Under load (rollouts in flight, batches coming one after another) the served app's writer
child journals each session as one row; once the stream pauses it builds their rows. These
tests load a real served app until the journal is seen holding sessions, take a copy of the
file at that moment (as the trace Volume's snapshot would), and check what every reader
makes of it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pickle
import sqlite3
import threading
import time

import pytest
from rollouts import fire, rollout_body
from sessions import make_session

from synth_deploy.serving import create_app
from synth_deploy.tracing import export_sft, open_trace_store

KEY = "sk-live-journal-0123456789abcdef"  # the policy's key each rollout is sent


def keyed_body(run_id: str, seed: int, url: str) -> dict:
    body = rollout_body(run_id, seed, url)
    body["policy"]["config"]["api_key"] = KEY
    return body


def journal_count(path) -> int:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT COUNT(*) FROM session_journal").fetchone()[0]


def raw_sessions(path) -> int:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT COUNT(*) FROM session_traces").fetchone()[0]


_RUN: list[tuple] = []  # the run, made once for the module's tests


@pytest.fixture
def busy_run(tmp_path_factory, request):
    """A served math app loaded until its journal held sessions: (the store's file, a copy
    taken while the journal held some, the run ids answered 200, what `export_sft` made
    of the live store)."""
    if not _RUN:
        _RUN.append(_busy_run(tmp_path_factory, request))
    return _RUN[0]


def _busy_run(tmp_path_factory, request):
    serve = request.getfixturevalue("serve")
    math_config = request.getfixturevalue("math_config")
    api_key = request.getfixturevalue("api_key")
    mock_policy = request.getfixturevalue("mock_policy")
    folder = tmp_path_factory.mktemp("journal")
    path, snapshot = folder / "t.db", folder / "snapshot.db"
    url = mock_policy.url + "/v1"
    answered: list[str] = []
    with open_trace_store(path) as store:
        server = serve(create_app(math_config, api_keys=[api_key], trace_store=store))
        seen = threading.Event()
        stop = threading.Event()

        def watch() -> None:
            # A copy the moment the journal holds sessions: SQLite's backup API, which
            # copies one consistent state (what the Volume snapshot does).
            while not stop.is_set() and not seen.is_set():
                with sqlite3.connect(path) as conn:
                    if conn.execute("SELECT COUNT(*) FROM session_journal").fetchone()[0]:
                        with sqlite3.connect(snapshot) as copy:
                            conn.backup(copy)
                        if journal_count(snapshot):
                            seen.set()
                time.sleep(0.002)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            for attempt in range(5):  # a loaded machine may space the batches out
                bodies = [keyed_body(f"run-{attempt}-{i}", i, url) for i in range(150)]
                results = asyncio.run(fire(server.url, api_key, bodies, concurrency=32))
                answered += [run for run, status in results if status == 200]
                if seen.is_set():
                    break
        finally:
            stop.set()
            watcher.join()
        assert seen.is_set(), "the writer child never journaled a session under load"
        # The server idle, its writer child builds the rows itself, with no reader asking.
        deadline = time.monotonic() + 30
        while journal_count(path):
            assert time.monotonic() < deadline, "the journal was not built while idle"
            time.sleep(0.05)
        assert raw_sessions(path) == len(answered)
        assert store.count_sessions(status="ok") == len(answered)
        exported = [json.loads(line) for line in export_sft_lines(store, folder)]
    return path, snapshot, answered, exported


def export_sft_lines(store, folder) -> list[str]:
    out = folder / "sft.jsonl"
    export_sft(store, out)
    return out.read_text().splitlines()


def test_under_load_sessions_are_journaled_and_every_answered_one_is_stored(busy_run):
    path, _, answered, exported = busy_run
    # Every answered rollout is in the tables, as any program reading them sees them.
    assert (journal_count(path), raw_sessions(path)) == (0, len(answered))
    with open_trace_store(path, read_only=True) as store:
        runs = {s.run_id for s in store.list_sessions(limit=None)}
        assert runs == set(answered)
        # A journaled session is whole: the math app's turn, its LM call, its rewards,
        # and the metadata the writer child described from the rollout's facts.
        for summary in store.list_sessions(limit=20):
            stored = store.get_session(summary.session_id)
            assert [m.message_type for m in stored.messages] == ["system", "user",
                                                                "assistant"]
            assert [e.event_type for e in stored.events] == ["cais", "environment"]
            assert stored.event_rewards and stored.outcome_rewards
            assert stored.metadata["status"] == "ok"
            assert stored.metadata["request"]["run_id"] == summary.run_id
    assert len(exported) == len(answered)
    assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_copy_taken_mid_run_shows_its_journaled_sessions_to_every_reader(busy_run,
                                                                         tmp_path):
    _, snapshot, _, _ = busy_run
    copy = tmp_path / "copy.db"
    copy.write_bytes(snapshot.read_bytes())
    in_journal, in_rows = journal_count(copy), raw_sessions(copy)
    assert in_journal > 0
    # The journal holds the request as the traces do: the policy's key masked.
    assert KEY.encode() not in copy.read_bytes()
    # A read-only reader (the `traces` commands) sees them all: their rows are built
    # through a connection of its own, and the journal is left empty.
    with open_trace_store(copy, read_only=True) as store:
        assert store.count_sessions() == in_rows + in_journal
        assert all(s.num_messages == 3 for s in store.list_sessions(limit=None))
    assert (journal_count(copy), raw_sessions(copy)) == (0, in_rows + in_journal)
    with sqlite3.connect(copy) as conn:  # the totals triggers counted them too
        assert conn.execute("SELECT COUNT(*) FROM session_traces").fetchone()[0] == \
            in_rows + in_journal


def _journal_rows(source, target) -> list[str]:
    """Put ``source``'s journal rows into ``target`` (a store of the same version) as
    they are: the session ids moved."""
    with sqlite3.connect(source) as src:
        rows = src.execute("SELECT session_id, body, rollout FROM session_journal").fetchall()
    with sqlite3.connect(target) as dst:
        dst.executemany("INSERT INTO session_journal (session_id, body, rollout) "
                        "VALUES (?, ?, ?)", rows)
    return [sid for sid, _, _ in rows]


def test_a_lost_answer_is_recorded_on_a_session_still_in_the_journal(busy_run, tmp_path):
    _, snapshot, _, _ = busy_run
    path = tmp_path / "t.db"
    with open_trace_store(path) as store:
        first, *_ = _journal_rows(snapshot, path)
        assert journal_count(path) > 0  # nothing has read the store since
        asyncio.run(store.record_lost_answer(first, {"code": "client_disconnected",
                                                     "message": "the client left"}))
        stored = store.get_session(first)
        assert stored.metadata["status"] == "error"
        assert stored.metadata["error"]["code"] == "client_disconnected"


class _RunsCode:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def test_a_journal_row_that_names_a_class_is_never_run_and_is_kept(tmp_path, caplog):
    path, marker = tmp_path / "t.db", tmp_path / "ran"
    with open_trace_store(path):
        pass
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO session_journal (session_id, body) VALUES (?, ?)",
                     ("evil", pickle.dumps(_RunsCode(marker))))
    with caplog.at_level(logging.ERROR, logger="synth_deploy.tracing"):
        with open_trace_store(path, read_only=True) as store:
            assert store.count_sessions() == 0
    assert not marker.exists()
    assert "cannot be read back" in caplog.text and "builtins.exec" in caplog.text
    assert journal_count(path) == 1  # kept, for whoever looks into it


def test_a_lost_answer_said_before_its_session_lands_is_applied_when_it_does(tmp_path):
    """A write that timed out (the client was answered trace_write_failed) may still land
    after the server has recorded that the answer was lost."""
    async def run():
        with open_trace_store(tmp_path / "t.db") as store:
            late, other = make_session(1), make_session(2)  # both stored "ok"
            await store.record_lost_answer(late.session_id, {
                "code": "trace_write_failed", "message": "its write timed out"})
            await store.write_session(late)
            await store.write_session(other)
            return store.get_session(late.session_id), store.get_session(other.session_id), \
                store.stats()

    late, other, stats = asyncio.run(run())
    assert late.metadata["status"] == "error"
    assert late.metadata["error"]["code"] == "trace_write_failed"
    assert other.metadata["status"] == "ok"  # the correction is that session's alone
    assert stats.ok == 1 and stats.sessions == 2  # the totals followed it


def test_a_stopping_writer_builds_its_journal_for_a_moment_at_most_and_a_reader_does_the_rest(
        tmp_path):
    # A container that drains must not wait on its writer child building rows: the child
    # builds for EXIT_BUILD_S (2 s) at most and exits; the next store to open the file
    # builds what is left. Twelve thousand sessions journaled take longer than that to build.
    path = tmp_path / "t.db"
    sessions = [make_session(i) for i in range(12_000)]

    async def write_all(store):
        child = store.use_writer_process()
        while not child.ready:
            await asyncio.sleep(0.01)
        loop, spinning = asyncio.get_running_loop(), [True]

        def keep_the_server_busy() -> None:
            # The child journals only while its parent is busy, which it reads from the
            # state of the parent's main thread: this one, kept running between writes
            # (a thread of its own would leave it asleep in the loop's poll).
            if spinning:
                until = time.monotonic() + 0.002
                while time.monotonic() < until:
                    pass
                loop.call_soon(keep_the_server_busy)

        loop.call_soon(keep_the_server_busy)
        try:
            await asyncio.gather(*(store.write_session(s) for s in sessions))
        finally:
            spinning.clear()
        return child.pid

    store = open_trace_store(path)
    store.write_timeout_s = 120
    pid = asyncio.run(write_all(store))
    assert journal_count(path) > 0, "the busy writer child journaled nothing"
    started = time.monotonic()
    store.close()
    closed_s = time.monotonic() - started
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # exited, not still building in the background
    left = journal_count(path)
    assert 0 < left < len(sessions) and closed_s < 10, (left, closed_s)
    with open_trace_store(path) as reader:
        assert reader.count_sessions() == len(sessions)
    assert journal_count(path) == 0
