"""The trace store on real SQLite files: writes, reads, schema, migrations, bad input."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sessions import assert_same, make_session
from trace_files import make_schema_too_new, make_synth_ai_db

from synth_deploy.env import Env
from synth_deploy.errors import TraceStoreError, UsageError
from synth_deploy.tracing import (
    DEFAULT_TRACE_DB,
    SCHEMA_VERSION,
    NotATraceDbError,
    SchemaTooNewError,
    SessionNotFoundError,
    SessionTracer,
    TraceDbMissingError,
    TraceDbUrlError,
    TraceStore,
    open_trace_store,
    parse_trace_db,
    resolve_trace_db,
    session_from_trace,
    since_timestamp,
)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_session_round_trips_through_the_database(tmp_path):
    session = make_session(7)
    with open_trace_store(str(tmp_path / "t.db")) as store:
        store.write_session_sync(session)
        loaded = store.get_session(session.session_id[:10])
    assert_same(loaded.to_dict(), session.to_dict())
    assert loaded.event_rewards[0].event_id == session.events[1].id
    assert loaded.messages[-1].content == {"structured": [1, 2]}


def test_values_json_has_no_type_for_are_stored_not_refused(tmp_path):
    # A rollout may note anything in its metadata: bytes that are not UTF-8, sets, objects.
    session = make_session(1)
    session.metadata.update(frame=b"\x89PNG\xff", tags={"b"}, obj=Path("/x"), nan=float("nan"),
                            text="été")
    with open_trace_store(str(tmp_path / "t.db")) as store:
        store.write_session_sync(session)
        meta = store.get_session(session.session_id).metadata
    assert meta["frame"] == "iVBOR_8="  # URL-safe base64
    assert meta["tags"] == ["b"] and meta["obj"] == "/x" and meta["text"] == "été"
    assert meta["nan"] != meta["nan"]  # NaN comes back as NaN, as json.dumps wrote it


def test_dict_form_inverts():
    session = make_session(3)
    assert session_from_trace(session.to_dict()).to_dict() == session.to_dict()


def test_many_concurrent_writers_all_land(tmp_path):
    sessions = [make_session(i, reward=i % 2) for i in range(300)]
    path = tmp_path / "t.db"

    async def main(store):
        await asyncio.gather(*(store.write_session(s) for s in sessions))

    with open_trace_store(str(path)) as store:
        asyncio.run(main(store))
        assert store.count_sessions() == 300
        assert store.table_counts()["events"] == 300 * 4
        assert store.integrity_check() == "ok"
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert {r[0] for r in conn.execute("SELECT run_id FROM session_traces")} == {
        f"run-{i}" for i in range(300)}


def test_a_bad_session_fails_alone(tmp_path):
    good, bad = make_session(1), make_session(2)
    bad.session_id = good.session_id  # duplicate primary key

    async def main(store):
        return await asyncio.gather(store.write_session(good), store.write_session(bad),
                                    return_exceptions=True)

    with open_trace_store(str(tmp_path / "t.db")) as store:
        results = asyncio.run(main(store))
        assert results[0] is None
        assert isinstance(results[1], TraceStoreError)
        assert store.count_sessions() == 1


def test_a_session_whose_rows_cannot_be_built_fails_alone_and_later_writes_land(tmp_path):
    # Such a session fails inside the write transaction: it must end there, or every
    # later write is refused ("cannot start a transaction within a transaction").
    bad = make_session(1)
    bad.timesteps[0].timestamp = "yesterday"
    odd = make_session(2)
    odd.outcome_rewards = []  # the reward is then read from the metrics,
    odd.metadata["metrics"] = "n/a"  # which are not an object: no reward, but stored

    with open_trace_store(str(tmp_path / "t.db")) as store:
        with pytest.raises(TypeError):
            store.write_session_sync(bad)
        store.write_session_sync(odd)
        store.write_session_sync(make_session(3))
        assert store.count_sessions() == 2
        assert store.integrity_check() == "ok"


def test_a_write_racing_close_is_refused_at_once(tmp_path):
    store = TraceStore(parse_trace_db(str(tmp_path / "t.db")), write_timeout_s=2.0)
    store.write_session_sync(make_session(0))  # the writer thread is running
    # Hold the writing thread just before the writer thread's queue takes the write (its
    # `submit`, found by name), run close() in full, then let it go on: it must see the
    # store closed, not queue behind the stop marker.
    at_lock, go_on, outcome = threading.Event(), threading.Event(), {}

    def tracer(frame, event, arg):
        code = frame.f_code
        if code.co_name != "submit" or \
                frame.f_globals.get("__name__") != "synth_deploy.tracing._write._thread":
            return None
        lines, first = inspect.getsourcelines(code)
        lock_line = first + next(i for i, text in enumerate(lines) if "with self._lock" in text)

        def line(frame, event, arg):
            if event == "line" and frame.f_lineno == lock_line:
                at_lock.set()
                go_on.wait(10)
            return line
        return line

    def write():
        session = make_session(1)
        sys.settrace(tracer)
        started = time.monotonic()
        try:
            store.write_session_sync(session)
        except TraceStoreError as exc:
            outcome["error"] = exc.message
        finally:
            sys.settrace(None)
            outcome["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=write)
    thread.start()
    assert at_lock.wait(10)
    store.close()
    go_on.set()
    thread.join(10)
    assert "is closed" in outcome.get("error", ""), outcome
    assert outcome["seconds"] < 1.5


def test_close_leaves_a_busy_writer_to_finish_and_close(tmp_path):
    path = tmp_path / "t.db"
    store = TraceStore(parse_trace_db(str(path)), write_timeout_s=0.5)
    blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")  # the writer's first commit waits for this lock
    release = threading.Timer(1.8, blocker.execute, ("ROLLBACK",))
    release.start()

    def write(i: int) -> None:
        try:
            store.write_session_sync(make_session(i))
        except TraceStoreError:
            pass  # the caller gave up waiting; the write itself goes on

    threads = [threading.Thread(target=write, args=(0,))]
    threads[0].start()
    time.sleep(0.3)  # session 0 is now being committed; 1 and 2 queue behind it
    threads += [threading.Thread(target=write, args=(i,)) for i in (1, 2)]
    for t in threads[1:]:
        t.start()
    time.sleep(0.1)
    started = time.monotonic()
    store.close()  # stops waiting after 0.5 s, and leaves the database to the writer
    assert time.monotonic() - started < 1.2  # the lock is released 1.4 s after close starts
    release.join()
    for t in threads:
        t.join(10)
    deadline, stored = time.monotonic() + 5, 0
    while stored < 3 and time.monotonic() < deadline:
        stored = blocker.execute("SELECT COUNT(*) FROM session_traces").fetchone()[0]
        time.sleep(0.05)
    blocker.close()
    assert stored == 3  # the queued sessions were committed, not failed on a closed database


def test_list_filters_stats_and_missing_session(tmp_path):
    with open_trace_store(str(tmp_path / "t.db")) as store:
        for i in range(6):
            store.write_session_sync(make_session(i, app="math" if i < 4 else "other",
                                                  reward=float(i % 2),
                                                  status="ok" if i != 5 else "error"))
        assert len(store.list_sessions(limit=3)) == 3
        assert {s.app_id for s in store.list_sessions(app="other")} == {"other"}
        assert [s.status for s in store.list_sessions(status="error")] == ["error"]
        rewarded = store.list_sessions(min_reward=0.5, newest_first=False)
        assert [(s.run_id, s.total_reward) for s in rewarded] == \
            [("run-1", 1.0), ("run-3", 1.0), ("run-5", 1.0)]
        stats = store.stats()
        assert (stats.sessions, stats.errors, stats.lm_calls) == (6, 1, 12)
        assert stats.input_tokens == sum(10 + i for i in range(6)) * 2
        assert {row["app_id"] for row in stats.by_app} == {"math", "other"}
        with pytest.raises(SessionNotFoundError):
            store.get_session("does-not-exist")


def test_since_parses_relative_and_absolute():
    assert since_timestamp("1h", now=7200.0) == "1970-01-01 01:00:00.000000"
    assert since_timestamp("2025-01-31").startswith("2025-01-31 00:00:00")
    with pytest.raises(UsageError):
        since_timestamp("yesterday-ish")


# -- schema -----------------------------------------------------------------------------

def test_migration_from_synth_ai_layout_keeps_data(tmp_path):
    path = tmp_path / "old.db"
    make_synth_ai_db(path)
    with open_trace_store(str(path)) as store:
        assert store.schema_version == SCHEMA_VERSION
        [old] = store.list_sessions(app="crafter")
        assert (old.run_id, old.seed, old.model, old.total_reward) == ("old-1", 4, "qwen", 0.25)
        loaded = store.get_session("old-session")
        assert [m.content for m in loaded.messages] == ["hi", "yo"]
        assert loaded.events[0].input_tokens == 3
        store.write_session_sync(make_session(1))  # new writes work on the migrated layout
        assert store.count_sessions() == 2
    versions = sqlite3.connect(path).execute("SELECT version FROM synth_deploy_schema")
    assert [v for (v,) in versions] == list(range(2, SCHEMA_VERSION + 1))


def test_newer_schema_is_refused_and_left_untouched(tmp_path):
    path = tmp_path / "new.db"
    make_schema_too_new(path)
    before = sha(path)
    with pytest.raises(SchemaTooNewError, match=f"version {SCHEMA_VERSION + 1}") as info:
        open_trace_store(str(path))
    assert "upgrade" in info.value.hint
    assert sha(path) == before


@pytest.mark.parametrize("content", [b"this is not a database at all\n" * 10,
                                     b"SQLite format 3\x00" + b"\xff" * 4000])
def test_non_sqlite_or_corrupt_file_is_refused_and_left_untouched(tmp_path, content):
    path = tmp_path / "junk.db"
    path.write_bytes(content)
    with pytest.raises(NotATraceDbError, match="junk.db") as info:
        open_trace_store(str(path))
    assert info.value.hint
    assert path.read_bytes() == content


def test_foreign_sqlite_database_is_refused(tmp_path):
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (id INTEGER)")
    conn.commit()
    conn.close()
    before = sha(path)
    with pytest.raises(NotATraceDbError, match="users"):
        open_trace_store(str(path))
    assert sha(path) == before


def test_missing_file_is_not_created_for_reads(tmp_path):
    path = tmp_path / "nested" / "t.db"
    with pytest.raises(TraceDbMissingError):
        open_trace_store(str(path), create=False)
    assert not path.parent.exists()


@pytest.fixture
def open_dir(tmp_path, tmp_path_factory):
    """A folder under tmp_path every user may traverse to (pytest makes its folders private to
    their owner): the folders above it are opened to traversal for the test, then closed."""
    # pytest-of-<user> and below (under pytest-xdist the base folder is one level deeper).
    top = next(p for p in tmp_path.parents if p.name.startswith("pytest-of-"))
    above = [tmp_path, *[p for p in tmp_path.parents if p == top or top in p.parents]]
    modes = {p: p.stat().st_mode & 0o777 for p in above}
    for folder in above:
        folder.chmod(modes[folder] | 0o011)
    path = tmp_path / "open"
    path.mkdir(mode=0o755)
    yield path
    for sub in path.iterdir():
        sub.chmod(0o755)
    for folder, mode in modes.items():
        folder.chmod(mode)


def test_read_only_folder_is_a_clear_error(open_dir):
    folder = open_dir / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    target = folder / "sub" / "t.db"
    if os.geteuid() != 0:
        with pytest.raises(TraceStoreError, match="ro") as info:
            open_trace_store(str(target))
        assert "writable" in info.value.hint
        return
    # root ignores permissions: check from a forked child running as nobody.
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.setgid(65534)
            os.setuid(65534)
            try:
                open_trace_store(str(target))
                message = "opened"
            except TraceStoreError as exc:
                message = f"{type(exc).__name__}|{exc.message}|{exc.hint}"
            except BaseException as exc:
                message = f"{type(exc).__name__}: {exc}"
            os.write(write_fd, message.encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read_fd) as fh:
        message = fh.read()
    assert status == 0
    kind, text, hint = (message.split("|") + ["", ""])[:3]
    assert kind == "TraceStoreError" and str(folder) in text and "writable" in hint


# -- configuration ----------------------------------------------------------------------


def env_of(**values: str) -> Env:
    return Env(values, {k: "/x/.env" for k in values})


def test_resolution_precedence_and_sources():
    env = env_of(SYNTH_TRACES_DB="from-env.db")
    assert resolve_trace_db("flag.db", env).source == "--trace-db"
    setting = resolve_trace_db(None, env)
    assert (setting.url, setting.source) == ("from-env.db", "SYNTH_TRACES_DB from /x/.env")
    default = resolve_trace_db(None, env_of())
    assert (default.url, default.source, default.is_remote) == (DEFAULT_TRACE_DB, "default",
                                                                False)
    assert resolve_trace_db("sqlite:///abs/t.db", env).path == Path("/abs/t.db")


def test_remote_urls_and_token_masking():
    token = "eyJsecret-token-value"
    turso = resolve_trace_db("libsql://db-org.turso.io", env_of(TURSO_AUTH_TOKEN=token))
    assert turso.is_remote and turso.auth_token == token
    assert token not in turso.display and token not in repr(turso)
    inline = resolve_trace_db(f"https://db.turso.io?authToken={token}", env_of())
    assert inline.remote_url == "https://db.turso.io" and token not in inline.display
    sqld = resolve_trace_db("http://127.0.0.1:8080", env_of())
    assert sqld.is_remote and sqld.auth_token is None
    with pytest.raises(TraceDbUrlError, match="no auth token"):
        resolve_trace_db("libsql://db-org.turso.io", env_of())
    with pytest.raises(TraceDbUrlError, match="postgres") as info:
        resolve_trace_db("postgres://u:pw@h/db", env_of())
    assert "pw" not in info.value.message and info.value.exit_code == 2


def test_session_ids_stay_unique_when_a_rollout_seeds_random():
    # Environments seed `random` for reproducible episodes; ids must not follow it.
    import random

    ids = set()
    for _ in range(50):
        random.seed(7)
        ids.add(SessionTracer().session_id)
    assert len(ids) == 50


OPEN_IN_SLOTS = r'''
import json, sys, time
from pathlib import Path
from synth_deploy.tracing import open_trace_store
root, files = Path(sys.argv[1]), int(sys.argv[2])
start, slot = float(sys.argv[3]), float(sys.argv[4])
open_trace_store(root / f"warm-{sys.argv[5]}.db").close()  # every import done before the race
failed = []
for i in range(files):
    while time.time() < start + i * slot:  # all processes open file i at the same instant
        pass
    try:
        open_trace_store(root / f"{i}.db").close()
    except Exception as exc:
        failed.append(f"{i}.db: {exc}")
print(json.dumps(failed))
'''


HOLD_A_WRITE_LOCK = r'''
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("held", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("ROLLBACK")
'''


def test_opening_a_new_file_another_process_is_writing_waits_for_it(tmp_path):
    # What a server starting beside another on a file that does not exist yet meets: the
    # other holds a write lock (switching the file to WAL, or migrating it). Switching the
    # file to WAL, SQLite refused this one at once ("database is locked", without waiting:
    # waiting could deadlock) and the server exited.
    path = tmp_path / "new.db"
    other = subprocess.Popen([sys.executable, "-c", HOLD_A_WRITE_LOCK, str(path), "0.5"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "held"
        with open_trace_store(path) as store:
            assert store.schema_version == SCHEMA_VERSION
    finally:
        other.kill()
        other.wait(10)


def test_processes_that_open_a_new_trace_file_at_once_all_open_it(tmp_path):
    # The same race, as it happens: three processes open 20 new files, each at the same
    # instant (how often one was refused depends on the disk: the other's lock lasts an
    # fsync).
    start = time.time() + 3.0
    procs = [subprocess.Popen([sys.executable, "-c", OPEN_IN_SLOTS, str(tmp_path), "20",
                               str(start), "0.05", str(n)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for n in range(3)]
    failed = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        failed += json.loads(out)
    assert failed == []
    for i in range(20):
        with open_trace_store(tmp_path / f"{i}.db", read_only=True) as store:
            assert store.schema_version == SCHEMA_VERSION


def test_timestamps_are_stored_as_synth_ai_writes_them_whatever_their_fraction(tmp_path):
    # Sortable UTC text to the microsecond, rounded as timedelta rounds (half to even): at
    # the edges of a second, before 1970, and many in one second (formatted once).
    from datetime import datetime, timedelta

    edges = [0.0, 1e-9, 0.9999994, 0.9999996, 86399.9999995, -1.25, -0.0000004,
             1764000000.0000005, 1764000000.0000015, 1764000000.9999995]
    times = edges + [1764000000 + k / 7 for k in range(40)]
    path = tmp_path / "t.db"
    ids = {}
    with open_trace_store(path) as store:
        for i, ts in enumerate(times):
            session = make_session(i)
            session.created_at = ids[session.session_id] = ts
            store.write_session_sync(session)
    rows = sqlite3.connect(path).execute("SELECT session_id, created_at FROM session_traces")
    written = {sid: text for sid, text in rows}
    assert written and {sid: written[sid] for sid in ids} == {
        sid: (datetime(1970, 1, 1) + timedelta(seconds=ts)).isoformat(" ", "microseconds")
        for sid, ts in ids.items()}
