"""`synth-deploy traces pull` against the stand-in Volume's committed state (no containers):
what it says, what it refuses, and a pull cut short that resumes."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import sqlite3
import threading
import time
from contextlib import closing
from dataclasses import replace

from sessions import make_session
from standins.modal_helpers import COMMAND as STANDIN
from trace_files import make_schema_too_new
from typer.testing import CliRunner

from synth_deploy.cli import app as cli_app
from synth_deploy.env import load_env
from synth_deploy.modal import ModalCLI, VolumeSnapshots, pull_traces
from synth_deploy.tracing import SessionLog, open_trace_store, parse_trace_db, write_session_log


def _pull(*args: str):
    return CliRunner().invoke(cli_app, ["traces", "pull", *args, "--modal-cli", STANDIN],
                              catch_exceptions=False)


def _container_file(state, volume: str, app: str, task: str, first: int, count: int):
    path = state / "volumes" / volume / app / f"{task}.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open_trace_store(path) as store:
        store.write_sessions_sync([make_session(i) for i in range(first, first + count)])
    return path


def _segment(state, task: str, n: int, first: int, count: int):
    path = _container_file(state, "synth-x-traces", "synth-x", task, first, count)
    return path.rename(path.with_name(f"{task}.{n}.db"))


def _log_file(state, name: str, first: int, count: int):
    path = state / "volumes" / "synth-x-traces" / "synth-x" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    log = SessionLog()
    for i in range(first, first + count):
        assert log.append(make_session(i))
    write_session_log(path, log.take())
    return path


def _stored(home) -> int:
    with open_trace_store(home, read_only=True) as store:
        return store.count_sessions()


def test_a_damaged_segment_between_good_ones_is_skipped_named_and_merged_once_replaced(
        standin, tmp_path):
    state, home = standin["state"], tmp_path / "home.db"
    _segment(state, "ta-1", 1, 0, 4)
    damaged = _segment(state, "ta-1", 2, 4, 3)
    _segment(state, "ta-1", 3, 7, 2)
    _segment(state, "ta-2", 1, 9, 5)  # another container's, sorted after it
    whole = damaged.read_bytes()
    damaged.write_bytes(whole[:len(whole) // 2])  # cut mid-upload

    first = _pull("synth-x", "--trace-db", str(home))
    assert first.exit_code == 1, first.output
    assert "synth-x-traces:synth-x/ta-1.2.db was not merged" in first.output
    assert "was not merged: its copy is corrupt or not a SQLite database" in first.output
    assert "1 file not merged (below)" in first.output
    assert "inspect it: modal volume get synth-x-traces synth-x/ta-1.2.db ta-1.2.db" in \
        first.output
    assert "the next pull tries this one again" in first.output
    assert "modal volume rm" not in first.output and "Traceback" not in first.output
    assert "ta-2: 5 new" in first.output  # the files after it were merged
    assert _stored(home) == 4 + 2 + 5
    copy = tmp_path / "pulled" / "synth-x-traces" / "synth-x" / "ta-1.2.db"
    assert copy.read_bytes() == damaged.read_bytes()  # kept for a look

    again = _pull("synth-x", "--trace-db", str(home), "--json")  # still damaged: named again
    assert again.exit_code == 1, again.output
    report = json.loads(again.stdout)
    assert [u["path"] for u in report["unread"]] == ["synth-x/ta-1.2.db"]
    assert (report["downloaded"], report["sessions_added"]) == (0, 0)

    damaged.write_bytes(whole)  # the whole file, as the container wrote it
    last = _pull("synth-x", "--trace-db", str(home), "--json")
    assert last.exit_code == 0, last.output
    report = json.loads(last.stdout)
    assert (report["downloaded"], report["sessions_added"], report["unread"]) == (1, 3, [])
    assert _stored(home) == 14
    assert not copy.exists()


def test_a_file_from_a_newer_kit_says_upgrade_and_never_suggests_removing_it(
        standin, tmp_path):
    state, home = standin["state"], tmp_path / "home.db"
    folder = state / "volumes" / "synth-x-traces" / "synth-x"
    _segment(state, "ta-1", 1, 0, 2)
    folder.joinpath("ta-1.2.db").parent.mkdir(parents=True, exist_ok=True)
    make_schema_too_new(folder / "ta-1.2.db")
    newer_log = _log_file(state, "ta-1.3.log", 2, 2)
    newer_log.write_bytes(newer_log.read_bytes().replace(b"session log 1\n",
                                                         b"session log 2\n", 1))
    _log_file(state, "ta-1.4.log", 4, 3)

    result = _pull("synth-x", "--trace-db", str(home), "--json")
    assert result.exit_code == 1, result.output
    unread = {u["path"]: u for u in json.loads(result.stdout)["unread"]}
    assert sorted(unread) == ["synth-x/ta-1.2.db", "synth-x/ta-1.3.log"]
    assert "newer than this synth-deploy" in unread["synth-x/ta-1.2.db"]["reason"]
    assert "format 2, newer than this synth-deploy reads" in \
        unread["synth-x/ta-1.3.log"]["reason"]
    for u in unread.values():
        assert u["hint"].startswith("upgrade synth-deploy (pip install -U synth-deploy), "
                                    "then pull again")
        assert "rm" not in u["hint"].split() and "remove" not in u["hint"]
    assert _stored(home) == 2 + 3


def test_a_log_whose_session_id_is_not_utf8_is_an_error_for_that_file(standin, tmp_path):
    state, home = standin["state"], tmp_path / "home.db"
    bad = _log_file(state, "ta-1.1.log", 0, 2)
    data = bytearray(bad.read_bytes())
    # The first record's session id: after the file's magic line and the record's header.
    data[data.index(b"\n") + 1 + 12] = 0xFF
    bad.write_bytes(bytes(data))
    _log_file(state, "ta-1.2.log", 2, 2)
    result = _pull("synth-x", "--trace-db", str(home))
    assert result.exit_code == 1, result.output
    assert "synth-x/ta-1.1.log was not merged" in result.output
    assert "record 1 (byte 27) has a session id that is not UTF-8" in result.output
    assert "Traceback" not in result.output and "UnicodeDecodeError" not in result.output
    assert _stored(home) == 2


def test_human_output_names_each_container_and_the_total(standin, tmp_path):
    _container_file(standin["state"], "team", "synth-x", "ta-9", 0, 2)
    result = _pull("synth-x", "--volume", "team", "--trace-db", str(tmp_path / "h.db"))
    assert result.exit_code == 0, result.output
    assert "ta-9: 2 new, 0 already here (1 file, " in result.output
    assert "pulled 1 file of 1 container from the Volume team: 2 session(s) added" in \
        result.output


def test_an_app_that_has_recorded_nothing_yet(standin, tmp_path):
    (standin["state"] / "volumes" / "synth-x-traces").mkdir(parents=True)
    result = _pull("synth-x", "--trace-db", str(tmp_path / "h.db"))
    assert result.exit_code == 0, result.output
    assert "no trace files in synth-x-traces/synth-x yet" in result.output


def test_a_volume_that_does_not_exist_says_how_to_name_it(standin, tmp_path):
    result = _pull("synth-nothing", "--trace-db", str(tmp_path / "h.db"))
    assert result.exit_code != 0
    assert "the Modal Volume 'synth-nothing-traces' does not exist" in result.output
    assert "task app's id" in result.output and "Traceback" not in result.output


def test_a_task_app_id_finds_its_deployed_app_and_volume(standin, tmp_path):
    # The bundled math app deploys as synth-math, recording to synth-math-traces.
    _container_file(standin["state"], "synth-math-traces", "synth-math", "ta-1", 0, 3)
    result = _pull("math", "--trace-db", str(tmp_path / "h.db"), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["volume"], report["folder"]) == ("synth-math-traces", "synth-math")
    assert report["sessions_added"] == 3


def _app_file(folder, app_id: str, settings: str):
    path = folder / f"{app_id.replace('-', '_')}.py"
    path.write_text(
        "from synth_deploy.modal import ModalSettings\n"
        "from synth_deploy.taskapp import TaskApp\n\n"
        f"task_app = TaskApp({app_id!r}, name='Team', description='d',\n"
        f"                   modal=ModalSettings({settings}))\n\n\n"
        "@task_app.rollout\nasync def rollout(request, ctx):\n    return None\n")
    return path


def test_a_task_app_file_brings_its_own_volume_setting(standin, tmp_path):
    app = _app_file(tmp_path, "team-app", "name='team-run', trace_volume='team-traces'")
    _container_file(standin["state"], "team-traces", "team-run", "ta-4", 0, 2)
    result = _pull(str(app), "--trace-db", str(tmp_path / "h.db"), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["volume"], report["folder"]) == ("team-traces", "team-run")
    assert report["sessions_added"] == 2


def test_an_app_that_keeps_no_volume_says_there_is_nothing_to_pull(standin, tmp_path):
    app = _app_file(tmp_path, "volumeless-app", "trace_volume=False")
    result = _pull(str(app), "--trace-db", str(tmp_path / "h.db"))
    assert result.exit_code != 0
    assert "nothing to pull" in result.output and "trace_volume=False" in result.output
    assert "Traceback" not in result.output


def test_no_modal_token_is_said_before_anything_runs(standin, tmp_path, monkeypatch):
    monkeypatch.delenv("MODAL_TOKEN_ID")
    monkeypatch.delenv("MODAL_TOKEN_SECRET")
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.modal.toml either
    result = _pull("synth-x", "--trace-db", str(tmp_path / "h.db"))
    assert result.exit_code != 0 and "modal token new" in result.output


def test_segments_merged_once_are_neither_fetched_nor_read_again_but_a_new_store_gets_all(
        standin, tmp_path):
    # A container's segments never change once written: a second pull into the same store
    # downloads and reads none of them. Another store beside it (the same ledger) lacks
    # their sessions, so it gets every one.
    state = standin["state"]
    for n, (first, count) in enumerate([(0, 3), (3, 2)], 1):
        segment = _container_file(state, "synth-x-traces", "synth-x", "ta-1", first, count)
        segment.rename(segment.with_name(f"ta-1.{n}.db"))
    _container_file(state, "synth-x-traces", "synth-x", "ta-2", 5, 4)  # an older whole file

    def pull(db: str) -> dict:
        result = _pull("synth-x", "--trace-db", str(tmp_path / db), "--json")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    first = pull("home.db")
    assert (first["files"], first["downloaded"], first["sessions_added"]) == (3, 3, 9)
    assert {c["container"]: (c["files"], c["added"]) for c in first["containers"]} == {
        "ta-1": (2, 5), "ta-2": (1, 4)}
    pulled = tmp_path / "pulled" / "synth-x-traces" / "synth-x"
    assert [p.name for p in pulled.iterdir()] == ["pulled.json"]  # merged: copies removed
    again = pull("home.db")  # a pull that read a file again would have to fetch it again
    assert (again["downloaded"], again["bytes"], again["sessions_added"]) == (0, 0, 0)
    assert again["sessions_skipped"] == 9
    other = pull("other.db")
    assert (other["downloaded"], other["sessions_added"]) == (3, 9)


def test_many_new_segments_come_in_one_fetch_and_a_few_in_one_each(standin, tmp_path):
    # A `modal volume get` is a process and a connection each: a long run's hundreds of
    # segments come in one fetch of the folder, unless most of its bytes are merged already.
    state = standin["state"]
    gets = state / "calls.jsonl"

    def segments(task: str, numbers: range) -> None:
        for n in numbers:
            segment = _container_file(state, "synth-x-traces", "synth-x", task, n * 10, 2)
            segment.rename(segment.with_name(f"{task}.{n}.db"))

    def pull() -> tuple[dict, list[list[str]]]:
        gets.unlink(missing_ok=True)
        result = _pull("synth-x", "--trace-db", str(tmp_path / "home.db"), "--json")
        assert result.exit_code == 0, result.output
        calls = [json.loads(line) for line in gets.read_text().splitlines()]
        return json.loads(result.stdout), [c for c in calls if c[:2] == ["volume", "get"]]

    segments("ta-1", range(1, 6))
    segments("ta-2", range(1, 3))
    report, fetches = pull()
    assert (report["files"], report["downloaded"], report["sessions_added"]) == (7, 7, 14)
    assert fetches == [["volume", "get", "synth-x-traces", "synth-x", fetches[0][4]]]  # the folder
    pulled = tmp_path / "pulled" / "synth-x-traces" / "synth-x"
    assert [p.name for p in pulled.iterdir()] == ["pulled.json"]  # no copies left behind

    segments("ta-1", range(6, 8))  # two new ones: each its own fetch
    report, fetches = pull()
    assert report["sessions_added"] == 4
    assert sorted(c[3] for c in fetches) == ["synth-x/ta-1.6.db", "synth-x/ta-1.7.db"]

    segments("ta-2", range(3, 8))  # five new, but the folder is mostly merged already
    report, fetches = pull()
    assert report["sessions_added"] == 10 and len(fetches) == 5
    assert all(c[3].startswith("synth-x/ta-2.") for c in fetches)

    with open_trace_store(tmp_path / "home.db", read_only=True) as store:
        assert store.count_sessions() == 28


def test_a_whole_store_file_that_changed_since_its_merge_is_fetched_again(standin, tmp_path):
    # Older deploys wrote one file per container and rewrote it: a pull must notice that
    # the file it merged has changed (its size and time), though its first session is here.
    state = standin["state"]
    _container_file(state, "synth-x-traces", "synth-x", "ta-1", 0, 2)
    home = str(tmp_path / "home.db")
    first = json.loads(_pull("synth-x", "--trace-db", home, "--json").stdout)
    assert first["sessions_added"] == 2
    _container_file(state, "synth-x-traces", "synth-x", "ta-1", 2, 3)  # the same file, grown
    again = json.loads(_pull("synth-x", "--trace-db", home, "--json").stdout)
    assert (again["downloaded"], again["sessions_added"], again["sessions_skipped"]) == (1, 3, 2)


class _Handle:
    """An object of the app's own class: no msgpack type holds it, so a session that
    carries one is stored in rows, not in the log."""


def test_an_answer_lost_after_its_session_was_pulled_is_carried_by_the_next_pull(
        standin, tmp_path):
    # A container appends each session to its log, and its client may be found gone
    # after the session went into a segment, and home. The mark waits in the store (the
    # session has no rows there), the next segment carries it, and the next pull marks the
    # session at home too. So for a session stored in rows (one the log cannot hold): the
    # mark changes its row, and is kept as well.
    folder = standin["state"] / "volumes" / "synth-x-traces" / "synth-x"
    local, home = tmp_path / "container.db", tmp_path / "home.db"
    sessions = [make_session(i) for i in range(3)]
    lost, in_rows = sessions[1].session_id, sessions[0].session_id
    sessions[0].metadata["handle"] = _Handle()
    store = open_trace_store(replace(parse_trace_db(str(local)), session_log=True))
    snapshots = VolumeSnapshots(local, folder, "ta-1", lambda: None, every_s=3600)

    async def record() -> None:
        await asyncio.gather(*(store.write_session(s) for s in sessions))

    async def lose_answers() -> None:
        for session_id in (lost, in_rows):
            await store.record_lost_answer(session_id, {"code": "client_gone",
                                                        "message": "it left"})

    def pull() -> dict:
        result = _pull("synth-x", "--trace-db", str(home), "--json")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    asyncio.run(record())
    assert snapshots.snapshot() is True
    first = pull()
    assert (first["sessions_added"], first["sessions_amended"]) == (3, 0)
    asyncio.run(lose_answers())
    snapshots.stop()
    store.close()
    # The logged sessions went to the Volume, unbuilt: one row (the session the log could
    # not hold), and the two marks.
    with closing(sqlite3.connect(local)) as conn:
        assert [conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] for table in (
            "session_journal", "session_traces", "session_amendments")] == [0, 1, 2]
    second = pull()
    assert (second["sessions_added"], second["sessions_amended"]) == (0, 2)
    marked = {lost, in_rows}
    with open_trace_store(home, read_only=True) as pulled:
        statuses = {s.session_id: s.metadata["status"] for s in
                    map(pulled.get_session, [s.session_id for s in sessions])}
        assert pulled.get_session(lost).metadata["error"]["code"] == "client_gone"
    assert statuses == {s.session_id: "error" if s.session_id in marked else "ok"
                        for s in sessions}
    # A store pulling both segments afresh gets the sessions from the first and the marks
    # from the second.
    fresh = _pull("synth-x", "--trace-db", str(tmp_path / "fresh.db"))
    assert fresh.exit_code == 0, fresh.output
    assert "2 sessions marked as errors" in " ".join(fresh.output.split())
    with open_trace_store(tmp_path / "fresh.db", read_only=True) as pulled:
        assert {pulled.get_session(i).metadata["status"] for i in marked} == {"error"}


def test_files_fetched_one_by_one_are_fetched_a_few_at_a_time(standin, tmp_path,
                                                              monkeypatch):
    # A pull during a run: a few new segments beside many merged ones, each its own
    # `modal volume get` (mostly the call's start and connection). They run a few at a
    # time, ahead of the merge, never more than FETCHES_AT_ONCE, and each is merged once.
    state = standin["state"]
    for n in range(1, 13):
        _container_file(state, "synth-x-traces", "synth-x", "ta-1", n * 10, 2).rename(
            state / "volumes" / "synth-x-traces" / "synth-x" / f"ta-1.{n}.db")
    home = str(tmp_path / "home.db")
    assert json.loads(_pull("synth-x", "--trace-db", home, "--json").stdout)[
        "sessions_added"] == 24
    for n in range(13, 19):
        _container_file(state, "synth-x-traces", "synth-x", "ta-1", n * 10, 2).rename(
            state / "volumes" / "synth-x-traces" / "synth-x" / f"ta-1.{n}.db")
    (state / "gets.jsonl").unlink(missing_ok=True)
    monkeypatch.setenv("STANDIN_MODAL_GET_S", "0.5")
    result = _pull("synth-x", "--trace-db", home, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["sessions_added"] == 12
    gets = [json.loads(line) for line in (state / "gets.jsonl").read_text().splitlines()]
    assert sorted(g["remote"] for g in gets) == [f"synth-x/ta-1.{n}.db" for n in range(13, 19)]
    # The most running at one moment: at some fetch's start (an interval that overlaps
    # a slow one is not, for that, running beside every other that does).
    at_once = max(sum(other["start"] <= g["start"] < other["end"] for other in gets)
                  for g in gets)
    assert 2 <= at_once <= 4, at_once
    pulled = tmp_path / "pulled" / "synth-x-traces" / "synth-x"
    assert [p.name for p in pulled.iterdir()] == ["pulled.json"]  # no copies left behind


def test_ctrl_c_stops_the_fetches_under_way_at_once(standin, tmp_path, monkeypatch):
    # The calls run on worker threads, which Ctrl-C does not reach: the pull must stop
    # them itself, not wait out each call's time limit, and leave no copy behind.
    state = standin["state"]
    for n in range(1, 4):  # three new files: each its own call (fewer than ONE_FETCH_FROM)
        _container_file(state, "synth-x-traces", "synth-x", "ta-1", n * 10, 2).rename(
            state / "volumes" / "synth-x-traces" / "synth-x" / f"ta-1.{n}.db")
    monkeypatch.setenv("STANDIN_MODAL_GET_S", "30")
    # The user's Ctrl-C: SIGINT to this process (the main thread waits on the first call).
    ctrl_c = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGINT))
    started = time.monotonic()
    with open_trace_store(tmp_path / "home.db") as store:
        ctrl_c.start()
        try:
            pull_traces("synth-x", store, load_env(environ=os.environ),
                        cli=ModalCLI(shlex.split(STANDIN)))
        except KeyboardInterrupt:
            pass
        else:
            raise AssertionError("the pull was not interrupted")
        finally:
            ctrl_c.cancel()  # never a SIGINT that outlives the pull
        assert store.count_sessions() == 0
    assert time.monotonic() - started < 15  # each call would have taken 30 s
    assert not (state / "gets.jsonl").exists()  # no call ran to its end
    pulled = tmp_path / "pulled" / "synth-x-traces" / "synth-x"
    assert [p.name for p in pulled.iterdir()] == []
