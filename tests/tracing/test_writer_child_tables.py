"""What the writer child stores is what the store's own thread stores: every table, every row.

A served app's sessions are committed by its writer child once the child is ready (its first
rollouts go through the store's thread while it starts), so a test that writes a handful of
sessions to a fresh server reads back what the thread stored. Here the same sessions go
through each path on purpose, the child's after it has said it is ready, and every table of
both files is read back."""

from __future__ import annotations

import asyncio
import copy
import sqlite3

import pytest
from sessions import assert_same, make_session
from trace_files import ready_writer_child

from synth_deploy.tracing import open_trace_store

SESSIONS = 12


def table_counts(path) -> dict[str, int]:
    with sqlite3.connect(path) as conn:
        tables = [name for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
        return {t: conn.execute(f'SELECT COUNT(*) FROM "{t}"').fetchone()[0] for t in tables}


@pytest.mark.parametrize("together", [False, True], ids=["one_by_one", "together"])
def test_the_writer_child_stores_every_table_the_thread_does(tmp_path, together):
    # One by one, the child builds each session's rows as it comes; together (a busy
    # server's frames), it may journal them and build their rows when it is idle.
    by_thread, by_child = tmp_path / "thread.db", tmp_path / "child.db"
    sessions = [make_session(i) for i in range(SESSIONS)]  # the same ones to each path
    with open_trace_store(by_thread) as store:
        store.write_sessions_sync(copy.deepcopy(sessions))

    with open_trace_store(by_child) as store:
        async def through_the_child() -> None:
            child = await ready_writer_child(store)
            copies = copy.deepcopy(sessions)
            if together:
                await asyncio.gather(*(store.write_session(session) for session in copies))
            for session in [] if together else copies:
                await store.write_session(session)
            assert child.alive  # the child, not a fallback, took them

        asyncio.run(through_the_child())

    expected, stored = table_counts(by_thread), table_counts(by_child)
    assert stored == expected
    # The tables a session's rows go to are all written (a child dropping one would leave
    # it empty in its file, and equal to nothing).
    for table in ("session_traces", "session_timesteps", "events", "messages"):
        assert stored[table] >= SESSIONS, (table, stored)
    with open_trace_store(by_thread, create=False) as thread_store, \
            open_trace_store(by_child, create=False) as child_store:
        for session in sessions:
            assert_same(child_store.get_session(session.session_id).to_dict(),
                        thread_store.get_session(session.session_id).to_dict(),
                        session.session_id)
