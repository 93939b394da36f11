"""The remote path (Turso / sqld) against the Hrana-over-HTTP stand-in in tests/standins/.

The stand-in is a real HTTP server process backed by a real SQLite file; the client side is
the real ``libsql`` package, driven by the store's worker process.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time

import pytest
from trace_files import make_schema_too_new
from typer.testing import CliRunner

from synth_deploy.cli import app
from synth_deploy.env import Env
from synth_deploy.serving import create_app
from synth_deploy.tracing import (
    SCHEMA_VERSION,
    TraceDbAuthError,
    TraceDbUnreachableError,
    TraceStore,
    describe_trace_db,
    export_sft,
    init_trace_db,
    open_trace_store,
    parse_trace_db,
)

pytest.importorskip("libsql")

from processes import refused_port  # noqa: E402
from rollouts import fire, rollout_body  # noqa: E402
from sessions import assert_same, make_session  # noqa: E402
from standins.libsql_hrana import start_hrana_process  # noqa: E402

TOKEN = "turso-test-token-" + "x" * 24


def token_env(token: str = TOKEN) -> Env:
    return Env({"TURSO_AUTH_TOKEN": token}, {"TURSO_AUTH_TOKEN": "environment"})


@pytest.fixture
def hrana(tmp_path):
    db = tmp_path / "remote.db"
    proc, url = start_hrana_process(str(db), token=TOKEN)
    yield url, db
    proc.kill()
    proc.wait(10)


def test_sessions_are_written_to_and_read_from_the_remote_server(hrana):
    url, db = hrana
    sessions = [make_session(i) for i in range(40)]

    async def main(store):
        await asyncio.gather(*(store.write_session(s) for s in sessions))

    with open_trace_store(parse_trace_db(url, env=token_env())) as store:
        assert store.setting.is_remote
        asyncio.run(main(store))
        assert store.count_sessions() == 40
        assert_same(store.get_session(sessions[5].session_id).to_dict(),
                    sessions[5].to_dict())
        assert store.stats().lm_calls == 80
    # The rows are really in the server's file.
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 40 * 4
    assert conn.execute("SELECT MAX(version) FROM synth_deploy_schema").fetchone()[0] \
        == SCHEMA_VERSION


def test_served_app_traces_to_remote_and_exports(hrana, serve, math_config, api_key,
                                                 mock_policy, tmp_path):
    from synth_deploy.train import validate_sft_file

    url, _ = hrana
    with open_trace_store(parse_trace_db(url, env=token_env())) as store:
        server = serve(create_app(math_config, api_keys=[api_key], trace_store=store))
        bodies = [rollout_body(f"run-{i}", i, mock_policy.url + "/v1") for i in range(12)]
        results = asyncio.run(fire(server.url, api_key, bodies, concurrency=6))
        assert all(status == 200 for _, status in results)
        assert {s.run_id for s in store.list_sessions(limit=None)} == {r for r, _ in results}
        result = export_sft(store, tmp_path / "remote.jsonl")
    assert result.examples >= 12
    assert validate_sft_file(tmp_path / "remote.jsonl").ok


def test_wrong_token_is_a_clear_error_without_the_token(hrana):
    url, _ = hrana
    wrong = "wrong-token-" + "y" * 20
    with pytest.raises(TraceDbAuthError) as info:
        open_trace_store(parse_trace_db(url, env=token_env(wrong)))
    assert "TURSO_AUTH_TOKEN" in info.value.hint
    assert wrong not in str(info.value)
    report = describe_trace_db(url, token_env(wrong))
    assert report.reachable is True and report.error and wrong not in str(report.to_dict())


def test_unreachable_server_fails_fast_and_clearly():
    with refused_port() as port:
        started = time.monotonic()
        with pytest.raises(TraceDbUnreachableError, match="cannot reach") as info:
            open_trace_store(parse_trace_db(f"http://127.0.0.1:{port}", env=Env()))
    assert time.monotonic() - started < 10
    assert info.value.exit_code == 3


def test_a_server_that_never_answers_hits_the_timeout(tmp_path):
    proc, url = start_hrana_process(str(tmp_path / "stall.db"), stall=True)
    try:
        started = time.monotonic()
        with pytest.raises(TraceDbUnreachableError, match="did not answer within 1.5s"):
            TraceStore(parse_trace_db(url), connect_timeout_s=1.5)
        assert time.monotonic() - started < 6
    finally:
        proc.kill()
        proc.wait(10)


def test_where_reports_remote_source_and_counts(hrana):
    url, _ = hrana
    env = Env({"SYNTH_TRACES_DB": url, "TURSO_AUTH_TOKEN": TOKEN},
              {"SYNTH_TRACES_DB": ".env", "TURSO_AUTH_TOKEN": ".env"})
    report = describe_trace_db(None, env)
    assert report.source == "SYNTH_TRACES_DB from .env"
    assert report.token == "TURSO_AUTH_TOKEN from .env"
    # `where` reads only: a server without trace tables is reachable, and stays empty.
    assert report.reachable and not report.exists and report.schema_version is None
    assert "traces init" in report.hint
    report = init_trace_db(None, env)
    assert report.schema_version == SCHEMA_VERSION and report.counts["session_traces"] == 0
    assert describe_trace_db(None, env).schema_version == SCHEMA_VERSION
    assert TOKEN not in str(report.to_dict())


def foreign(path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (id INTEGER)")
    conn.commit()
    conn.close()


@pytest.mark.parametrize(("make", "words"), [(make_schema_too_new, "newer than"),
                                             (foreign, "not a trace store")])
def test_where_says_a_server_that_answered_is_reachable(tmp_path, make, words):
    db = tmp_path / "remote.db"
    make(db)
    proc, url = start_hrana_process(str(db), token=TOKEN)
    try:
        result = CliRunner().invoke(app, ["traces", "where", "--json", "--trace-db", url],
                                    env={"TURSO_AUTH_TOKEN": TOKEN})
    finally:
        proc.kill()
        proc.wait(10)
    report = json.loads(result.stdout)
    assert words in report["error"] and report["reachable"] is True
    assert result.exit_code == 1  # a failure, not 3 (unreachable)


def test_a_rescore_writes_its_versions_on_the_remote_server_too(hrana, tmp_path):
    from synth_deploy.tracing import SessionFilter, rescore_sessions, reward_versions_of

    url, db = hrana
    sessions = [make_session(i, reward=float(i % 2)) for i in range(6)]
    with open_trace_store(parse_trace_db(url, env=token_env())) as store:
        store.write_sessions_sync(sessions)
        result = rescore_sessions(store, SessionFilter(), lambda s: 1.0 - s.metadata["seed"] % 2,
                                  version="flipped", scorer={"function": "flip"})
        assert (result.matched, result.rescored, result.changed) == (6, 6, 6)
        assert reward_versions_of(store, sessions[1].session_id)[0]["reward"] == 0.0
        out = tmp_path / "sft.jsonl"
        export_sft(store, out, reward_version="flipped", min_reward=1.0)
        kept = {json.loads(line)["metadata"]["session_id"] for line in out.read_text().splitlines()}
    assert kept == {s.session_id for s in sessions[0::2]}
    # The rows are in the server's file, beside the recorded rewards, which did not change.
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM reward_versions").fetchone() == (6,)
        assert sorted(r for (r,) in conn.execute("SELECT total_reward FROM session_traces")) \
            == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
