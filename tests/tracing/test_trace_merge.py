"""merge_trace_file: another store's sessions, added once, whole, from a file left as it was."""

from __future__ import annotations

import asyncio
import datetime
import decimal
import hashlib
import json
import logging
import random
import sqlite3
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import pytest
from sessions import assert_same, log_record, make_session

from synth_deploy.errors import TraceStoreError
from synth_deploy.tracing import (
    SessionTrace,
    SessionTracer,
    TurnTokens,
    merge_trace_file,
    open_trace_store,
    parse_trace_db,
    read_session_log,
    session_log,
    write_session_log,
)


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_merge_adds_every_session_whole_then_nothing(tmp_path):
    source = tmp_path / "container.db"
    sessions = [make_session(i, reward=i % 2) for i in range(450)]
    with open_trace_store(source) as store:
        store.write_sessions_sync(sessions)
    before = _digest(source)

    with open_trace_store(tmp_path / "home.db") as home:
        home.write_session_sync(make_session(1000))  # what the laptop already had
        first = merge_trace_file(home, source)
        assert (first.added, first.skipped) == (450, 0)
        again = merge_trace_file(home, source)
        assert (again.added, again.skipped) == (0, 450)
        assert home.count_sessions() == 451
        for original in (sessions[0], sessions[-1]):
            assert_same(home.get_session(original.session_id).to_dict(), original.to_dict())
    assert _digest(source) == before  # read-only: not even a journal-mode switch


def _container_log(tmp_path, sessions) -> Path:
    """A log file of ``sessions`` as a Modal container's copier writes it."""
    local = tmp_path / "container.db"
    with open_trace_store(replace(parse_trace_db(str(local)), session_log=True)) as container:
        container.write_sessions_sync(sessions)
    path = tmp_path / "ta-1.1.log"
    write_session_log(path, session_log(local).take())
    return path


def _assert_merged_once_and_left_as_it_was(tmp_path, source, sessions) -> None:
    before = _digest(source)
    with open_trace_store(tmp_path / "home.db") as home:
        first = merge_trace_file(home, source)
        assert (first.added, first.skipped) == (len(sessions), 0)
        assert first.probe in {s.session_id for s in sessions}
        again = merge_trace_file(home, source)
        assert (again.added, again.skipped) == (0, len(sessions))
        for original in sessions:
            assert_same(home.get_session(original.session_id).to_dict(), original.to_dict())
    assert _digest(source) == before


def test_a_containers_log_copy_is_merged_each_session_once(tmp_path):
    # What a Modal container copies to its Volume of its session log: each session goes
    # into rows here once (three logged again, read in a later batch than their first
    # time), and the file is left as it was.
    sessions = [make_session(i, reward=i % 2) for i in range(210)]
    source = _container_log(tmp_path, sessions)
    source.write_bytes(source.read_bytes() + log_record(sessions[0])
                       + log_record(sessions[1]) + log_record(sessions[2]))
    _assert_merged_once_and_left_as_it_was(tmp_path, source, sessions)


def _chat_turn(tracer: SessionTracer, turn: int, history: list[dict]) -> None:
    # A policy call as call_policy records it: the event, then the bytes on the wire.
    tracer.start_timestep(f"turn-{turn}", turn_number=turn)
    history.append({"role": "user", "content": f"observation {turn}"})
    prompt = list(range(1, 6 * turn))  # each prompt holds the one before and its answer
    event = tracer.record_lm_call(model_name="m", usage={"prompt_tokens": len(prompt),
                                                         "completion_tokens": 2},
                                  tokens=TurnTokens(prompt, [6 * turn, 6 * turn + 1],
                                                    [-0.25, -0.5], model="m"))
    answer = {"choices": [{"message": {"role": "assistant", "content": f"move {turn}"}}],
              "usage": {"prompt_tokens": len(prompt), "completion_tokens": 2}}
    tracer.record_exchange(event, json.dumps({"model": "m", "messages": history}).encode(),
                           json.dumps(answer).encode())
    history.append(answer["choices"][0]["message"])


def test_a_logged_session_comes_home_as_the_rows_of_a_local_store_hold_it(tmp_path):
    # Token ids (sent packed), chats recorded as wire bytes, and metadata of the types
    # msgpack writes differently (a tuple, a datetime, an int key, a Decimal, bytes):
    # merged from the log, the session reads back as a store that wrote it itself holds it.
    tracer = SessionTracer(metadata={"app_id": "math", "status": "ok", "pair": (1, 2),
                                     "at": datetime.datetime(2026, 11, 29, 4, 30),
                                     7: "an int key", "price": decimal.Decimal("0.25"),
                                     "raw": b"\x00\xff"})
    history: list[dict] = []
    for turn in (1, 2, 3):
        _chat_turn(tracer, turn, history)
    tracer.record_outcome_reward(1.0)
    session = tracer.finish()
    tokens_before = [e.tokens for step in session.timesteps for e in step.events]
    file = _container_log(tmp_path, [session])
    assert [e.tokens for step in session.timesteps for e in step.events] == tokens_before
    with open_trace_store(tmp_path / "home.db") as home, \
            open_trace_store(tmp_path / "local.db") as local:
        assert merge_trace_file(home, file).added == 1
        local.write_session_sync(session)
        pulled, kept = (s.get_session(session.session_id) for s in (home, local))
        assert_same(pulled.to_dict(), kept.to_dict())
        assert [(t.prompt_ids, t.completion_ids, t.completion_logprobs)
                for t in pulled.turn_tokens] == [
            (list(range(1, 6 * n)), [6 * n, 6 * n + 1], [-0.25, -0.5]) for n in (1, 2, 3)]
        # The last turn's conversation: every message so far, from the wire bytes.
        assert [m.content for m in pulled.timesteps[-1].messages] == [
            m["content"] for m in history]


def _long_episode(turns: int) -> SessionTrace:
    # Each request holds the conversation so far: stored whole, the requests of an episode
    # would grow with the square of its turns. A judge call now and then sends a
    # conversation of its own, which repeats nothing of the call before it.
    tracer = SessionTracer(metadata={"app_id": "math", "status": "ok"})
    history: list[dict] = [{"role": "system", "content": "You play a long game. " * 20}]
    for turn in range(1, turns + 1):
        tracer.start_timestep(f"turn-{turn}", turn_number=turn)
        history.append({"role": "user", "content": f"observation {turn}: " + "x" * 150})
        reply = {"role": "assistant", "content": f"move {turn}"}
        event = tracer.record_lm_call(model_name="m")
        tracer.record_exchange(event, json.dumps({"model": "m", "messages": history}).encode(),
                               json.dumps({"choices": [{"message": reply}]}).encode())
        history.append(reply)
        if turn % 10 == 0:
            judge = tracer.record_lm_call(model_name="judge", system_instance_id="judge")
            tracer.record_exchange(judge, json.dumps({"model": "judge", "messages": [
                {"role": "user", "content": f"score move {turn}"}]}).encode(),
                json.dumps({"choices": [{"message": {"role": "assistant", "content": "7"}}]}
                           ).encode())
    tracer.record_outcome_reward(1.0)
    return tracer.finish(expand=False)  # as a served rollout's, its chats as wire bytes


def test_a_long_episodes_requests_go_as_what_each_adds_and_come_home_whole(tmp_path):
    short, long = _long_episode(30), _long_episode(60)
    requests = [list(step.exchanges) for step in long.timesteps]
    # Twice the turns, about twice the bytes (whole requests grow with the square).
    assert len(log_record(long)) < 2.3 * len(log_record(short))
    assert [step.exchanges for step in long.timesteps] == requests  # left as it was
    file = _container_log(tmp_path, [long])
    with open_trace_store(tmp_path / "home.db") as home, \
            open_trace_store(tmp_path / "local.db") as local:
        assert merge_trace_file(home, file).added == 1
        local.write_session_sync(long)
        pulled, kept = (s.get_session(long.session_id) for s in (home, local))
    # Each store made the messages from the wire bytes itself: the same, but for their ids.
    assert [(m.message_type, m.content, m.metadata) for m in pulled.messages] == [
        (m.message_type, m.content, m.metadata) for m in kept.messages]
    assert [e.call_records for e in pulled.events] == [e.call_records for e in kept.events]
    sent = [record["request"] for event in pulled.events for record in event.call_records]
    assert sent == [json.loads(request) for step in requests for _, request, _ in step]


def test_requests_that_repeat_any_part_of_the_one_before_come_home_byte_for_byte(tmp_path):
    # Two systems' calls interleaved, each request repeating none, some or all of the one
    # before it to the same system, then bytes of its own (not JSON: kept as text).
    rng = random.Random(7)
    tracer = SessionTracer(metadata={"app_id": "math", "status": "ok"})
    before = {"policy": "", "judge": ""}
    sent = []
    for turn in range(1, 121):
        system = rng.choice(list(before))
        last = before[system]
        cut = rng.choice([0, rng.randrange(len(last) + 1), len(last), len(last) - 1])
        request = last[:max(cut, 0)][-3000:] + "".join(rng.choices("ab", k=rng.randrange(1, 900)))
        before[system] = request
        tracer.start_timestep(f"turn-{turn}", turn_number=turn)
        event = tracer.record_lm_call(model_name="m", system_instance_id=system)
        tracer.record_exchange(event, request.encode(), b"not json")
        sent.append(request)
    session = tracer.finish(expand=False)
    file = _container_log(tmp_path, [session])
    with open_trace_store(tmp_path / "home.db") as home:
        assert merge_trace_file(home, file).added == 1
        pulled = home.get_session(session.session_id)
    assert [record["request_text"] for event in pulled.events
            for record in event.call_records] == sent


def test_a_log_the_first_version_wrote_is_still_merged(tmp_path):
    # Its records hold pickles (this kit's first session log, before msgpack): a Volume
    # that a container of an older deploy wrote to is still pulled.
    source = Path(__file__).parent / "data" / "session_log_v1.log"
    with open_trace_store(tmp_path / "home.db") as home:
        assert merge_trace_file(home, source).added == 3
        sessions = sorted((home.get_session(s.session_id) for s in home.list_sessions()),
                          key=lambda s: s.metadata["run_id"])
    assert [s.metadata["run_id"] for s in sessions] == ["run-0", "run-1", "run-2"]
    keys = [s.metadata["request"]["policy"]["config"]["api_key"] for s in sessions]
    assert all(key.startswith("****") for key in keys)  # masked when it was written
    assert [len(s.timesteps) for s in sessions] == [2, 2, 2]
    assert [s.outcome_rewards[0].total_reward for s in sessions] == [1.0] * 3


def test_a_file_holding_its_sessions_in_the_journal_is_merged_from_it_as_it_is(tmp_path):
    # A store a busy writer child journaled into (a journal row holds what a log record
    # does): its sessions go into rows here, each once (three journaled twice), and the
    # file is not built first (its bytes are left as they were).
    sessions = [make_session(i, reward=i % 2) for i in range(210)]
    records = read_session_log(_container_log(tmp_path, sessions)).records
    source = tmp_path / "journaled.db"
    open_trace_store(source).close()
    with closing(sqlite3.connect(source)) as conn, conn:
        conn.executemany("INSERT INTO session_journal (session_id, body, rollout) VALUES "
                         "(?, ?, ?)", records + records[:3])
    _assert_merged_once_and_left_as_it_was(tmp_path, source, sessions)


def test_a_journal_row_built_twice_is_one_session_not_a_conflict(tmp_path, caplog):
    # Two stores may build one journal row at once (a stopping writer child and a reader
    # opening the file): a session whose policy calls are made messages as it is built
    # must come out the same both times, so the second build is done, not a conflict.
    tracer, history = SessionTracer(), [{"role": "system", "content": "play"}]
    for turn in range(1, 4):
        _chat_turn(tracer, turn, history)
    session = tracer.finish(expand=False)
    records = read_session_log(_container_log(tmp_path, [session])).records
    path = tmp_path / "journaled.db"
    open_trace_store(path).close()
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.executemany("INSERT INTO session_journal (session_id, body, rollout) VALUES "
                         "(?, ?, ?)", records * 2)
    with caplog.at_level(logging.WARNING, logger="synth_deploy.tracing"):
        with open_trace_store(path) as store:
            stored = store.get_session(session.session_id)
            assert store.count_sessions() == 1
    assert "not stored" not in caplog.text
    for step in stored.timesteps:  # (a message a later turn repeats keeps its id there)
        assert len(step.messages) >= 2
        assert len({m.id for m in step.messages}) == len(step.messages)


def test_a_log_copy_cut_short_is_refused_before_anything_is_merged(tmp_path):
    sessions = [make_session(i) for i in range(3)]
    source = _container_log(tmp_path, sessions)
    source.write_bytes(source.read_bytes()[:-10])
    with open_trace_store(tmp_path / "home.db") as home:
        with pytest.raises(TraceStoreError, match="last .* bytes are not a whole session"):
            merge_trace_file(home, source)
        assert home.count_sessions() == 0


def test_a_lost_answer_in_the_file_marks_a_session_held_as_ok_and_only_that(tmp_path):
    # The one later change a merge carries: the file says the client of a session the store
    # holds as ok never got its answer. A session that failed from the start is no news.
    lost, kept = make_session(1), make_session(2)
    failed = make_session(3, status="error")
    earlier, later = tmp_path / "earlier.db", tmp_path / "later.db"
    for path in (earlier, later):
        with open_trace_store(path) as store:
            store.write_sessions_sync([lost, kept, failed])
    with open_trace_store(later) as store:
        asyncio.run(store.record_lost_answer(lost.session_id, {"code": "client_gone",
                                                               "message": "it left"}))
    with open_trace_store(tmp_path / "home.db") as home:
        assert merge_trace_file(home, earlier).added == 3
        merged = merge_trace_file(home, later)
        assert (merged.added, merged.skipped, merged.amended) == (0, 3, 1)
        assert merge_trace_file(home, later).amended == 0  # marked already
        assert home.get_session(lost.session_id).metadata["error"]["code"] == "client_gone"
        assert [home.get_session(s.session_id).metadata["status"] for s in (kept, failed)] \
            == ["ok", "error"]
        assert home.stats().ok == 1  # the totals followed the mark


def test_a_newer_copy_adds_only_its_new_sessions(tmp_path):
    source = tmp_path / "container.db"
    with open_trace_store(source) as store:
        store.write_sessions_sync([make_session(i) for i in range(3)])
    with open_trace_store(tmp_path / "home.db") as home:
        assert merge_trace_file(home, source).added == 3
        with open_trace_store(source) as store:
            store.write_sessions_sync([make_session(i) for i in range(3, 5)])
        result = merge_trace_file(home, source)
        assert (result.added, result.skipped) == (2, 3)


def test_a_file_that_is_not_a_trace_store_is_refused_and_kept(tmp_path):
    foreign = tmp_path / "other.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE notes (x)")
    before = _digest(foreign)
    with open_trace_store(tmp_path / "home.db") as home, pytest.raises(TraceStoreError):
        merge_trace_file(home, foreign)
    assert _digest(foreign) == before
