"""Tracing through a served task app: real uvicorn, the math app, the mock policy, real files."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from processes import free_port, wait_until_up
from rollouts import SERVER_SCRIPT, fire, rollout_body

from synth_deploy.serving import create_app
from synth_deploy.taskapp import RolloutRequest
from synth_deploy.tracing import SessionTrace, ledger_of, open_trace_store


def one_stored_rollout(tmp_path, serve, config, api_key, body: dict, status: int
                       ) -> tuple[dict, SessionTrace]:
    """Serve ``config`` tracing to a new store, send ``body`` (answered ``status``), and
    return the answer's JSON and the one session stored."""
    with open_trace_store(str(tmp_path / "traces.db")) as store:
        server = serve(create_app(config, api_keys=[api_key], trace_store=store))
        resp = httpx.post(server.url + "/rollout", json=body, timeout=30,
                          headers={"X-API-Key": api_key})
        assert resp.status_code == status
        [summary] = store.list_sessions(limit=None)
        return resp.json(), store.get_session(summary.session_id)


def test_concurrent_rollouts_through_a_served_app_all_land(tmp_path, serve, math_config,
                                                           api_key, mock_policy):
    path = tmp_path / "traces.db"
    with open_trace_store(str(path)) as store:
        server = serve(create_app(math_config, api_keys=[api_key], trace_store=store))
        bodies = [rollout_body(f"run-{i}", i, mock_policy.url + "/v1") for i in range(60)]
        bodies.append({**rollout_body("bad-policy", 1, "http://127.0.0.1:9/v1")})
        results = dict(asyncio.run(fire(server.url, api_key, bodies)))
        assert [r for r, status in results.items() if status != 200] == ["bad-policy"]
        sessions = store.list_sessions(limit=None)
        assert {s.run_id for s in sessions} == set(results)
        by_run = {s.run_id: s for s in sessions}
        assert by_run["bad-policy"].status == "error"
        ok = store.get_session(by_run["run-3"].session_id)
        assert ok.metadata["metrics"]["outcome_reward"] == by_run["run-3"].total_reward
        assert ok.metadata["request"]["run_id"] == "run-3"
        assert [m.message_type for m in ok.messages][:3] == ["system", "user", "assistant"]
        assert ok.events[0].event_type == "cais" and ok.events[0].model_name
        assert ok.outcome_rewards and ok.event_rewards[0].reward_type == "answer_format"
        failed = store.get_session(by_run["bad-policy"].session_id)
        assert failed.metadata["error"]["code"] == "policy_failed"  # the policy, not the app
    assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_policy_key_in_the_request_is_stored_masked(tmp_path, serve, math_config, api_key,
                                                      mock_policy):
    # Two rollouts: the second finds the key names already judged (is_secret_name's cache).
    policy_key = "sk-policy-key-0123456789abcdef"
    path = tmp_path / "traces.db"
    with open_trace_store(str(path)) as store:
        server = serve(create_app(math_config, api_keys=[api_key], trace_store=store))
        bodies = [rollout_body(f"keyed-{i}", i, mock_policy.url + "/v1") for i in range(2)]
        for body in bodies:
            body["policy"]["config"]["api_key"] = policy_key
        assert asyncio.run(fire(server.url, api_key, bodies)) == [("keyed-0", 200),
                                                                  ("keyed-1", 200)]
        for summary in store.list_sessions(limit=None):
            config = store.get_session(summary.session_id).metadata["request"]["policy"]["config"]
            assert config["api_key"].startswith("**** (sha256:")
            assert config["model"] == "mock-model"  # not a key name: kept as sent
    stored = b"".join(f.read_bytes() for f in tmp_path.iterdir() if f.name.startswith("traces"))
    assert b"keyed-1" in stored and policy_key.encode() not in stored


def test_a_key_anywhere_in_the_request_is_stored_masked(tmp_path, serve, math_config, api_key,
                                                       mock_policy):
    # Where clients put credentials besides policy.config.api_key (issue 38): headers, the
    # inference URL's userinfo and query, extra bodies, the environment's own config.
    keys = {name: f"sk-{name}-{i:02d}-0123456789abcdef" for i, name in enumerate(
        ("header", "user", "query", "env", "extra", "list"))}
    body = rollout_body("nested", 3, mock_policy.url.replace(
        "http://", f"http://user:{keys['user']}@") + f"/v1?cid=trace_n&api_key={keys['query']}")
    config = body["policy"]["config"]
    config.update({"headers": {"Authorization": f"Bearer {keys['header']}"},
                   "extra_body": {"api_key": keys["extra"]}, "api_keys": [keys["list"]],
                   "max_tokens": 64})
    body["env"]["config"] = {"openai_api_key": keys["env"], "max_turns": 2}
    path = tmp_path / "traces.db"
    with open_trace_store(str(path)) as store:
        server = serve(create_app(math_config, api_keys=[api_key], trace_store=store))
        resp = httpx.post(server.url + "/rollout", json=body, timeout=30,
                          headers={"X-API-Key": api_key})
        assert resp.status_code == 200, resp.text
        [summary] = store.list_sessions(limit=None)
        request = store.get_session(summary.session_id).metadata["request"]
    config = request["policy"]["config"]
    assert config["headers"]["Authorization"].startswith("**** (sha256:")
    assert config["inference_url"].startswith("http://****@127.0.0.1:")
    assert config["inference_url"].endswith("/v1?cid=trace_n&api_key=****")
    assert config["max_tokens"] == 64 and request["env"]["config"]["max_turns"] == 2  # kept
    stored = b"".join(f.read_bytes() for f in tmp_path.iterdir() if f.name.startswith("traces"))
    assert b"nested" in stored
    assert [name for name, key in keys.items() if key.encode() in stored] == []


def test_a_stored_session_says_which_rollout_it_was_and_keeps_what_the_app_noted(
        tmp_path, serve, math_config, api_key, mock_policy):
    async def noting(request, ctx):
        ctx.tracer.session.metadata.update({"difficulty": "hard", "model": "as-the-app-says"})
        result = math_config.rollout(request, ctx)
        return await result if inspect.isawaitable(result) else result

    body = rollout_body("noted", 7, mock_policy.url + "/v1?cid=trace_noted")
    _, stored = one_stored_rollout(tmp_path, serve, dataclasses.replace(
        math_config, rollout=noting), api_key, body, 200)
    metadata = stored.metadata
    assert {k: metadata[k] for k in ("app_id", "run_id", "mode", "seed", "env_name",
                                     "trace_correlation_id", "status")} == {
        "app_id": "math", "run_id": "noted", "mode": "eval", "seed": 7, "env_name": None,
        "trace_correlation_id": "trace_noted", "status": "ok"}
    assert (metadata["difficulty"], metadata["model"]) == ("hard", "as-the-app-says")
    assert metadata["duration_s"] > 0 and metadata["metrics"]["outcome_reward"] is not None
    # The request as the client sent it (replaying it gives the defaults back), the metrics
    # that were set.
    assert metadata["request"] == body
    assert RolloutRequest.model_validate(metadata["request"]).record.return_trace is False
    assert None not in metadata["metrics"].values()


def test_the_stored_metrics_leave_out_the_ledger_the_stored_session_gives_back(
        tmp_path, serve, math_config, api_key):
    # The response states the kit's cost ledger; the stored session holds what it is made of.
    async def priced(request, ctx):
        ctx.tracer.record_lm_call(model_name="m", input_tokens=120, output_tokens=30,
                                  latency_ms=25.0, cost_usd=0.002)
        return {"run_id": request.run_id,
                "metrics": {"outcome_reward": 1.0, "details": {"board": "clean"}}}

    body = rollout_body("priced", 2, "http://127.0.0.1:9/v1")
    answer, stored = one_stored_rollout(tmp_path, serve, dataclasses.replace(
        math_config, rollout=priced), api_key, body, 200)
    stated = answer["metrics"]["details"]
    assert stated["board"] == "clean" and stated["ledger"]["input_tokens"] == 120
    assert stored.metadata["metrics"]["details"] == {  # the app's details and the tokens
        k: v for k, v in stated.items() if k != "ledger"}
    assert ledger_of(stored).to_dict() == stated["ledger"]


def test_a_session_nobody_keeps_records_counts_not_the_conversation(serve, math_config,
                                                                   mock_policy, api_key):
    """Served untraced, a rollout's session is read only for its answer's metrics: its
    calls are counted (tokens, time) without their chat or call records. Returned, the same
    rollout's session holds both."""
    seen: list[SessionTrace] = []

    async def chatty(request, ctx):
        from synth_deploy.taskapp import call_policy

        await call_policy(ctx, [{"role": "user", "content": "2 + 2?"}])
        seen.append(ctx.tracer.session)
        return {"metrics": {"episode_rewards": [1.0]}}

    server = serve(create_app(dataclasses.replace(math_config, rollout=chatty),
                              api_keys=[api_key]))
    answers = []
    for returned in (False, True):
        body = {**rollout_body(f"kept-{returned}", 1, mock_policy.url + "/v1"),
                "record": {"return_trace": returned}}
        resp = httpx.post(server.url + "/rollout", json=body, timeout=30,
                          headers={"X-API-Key": api_key})
        assert resp.status_code == 200, resp.text
        answers.append(resp.json())
    untraced, returned = seen
    assert untraced.messages == [] and untraced.events[0].call_records is None
    assert [m.message_type for m in returned.messages] == ["user", "assistant"]
    assert returned.events[0].call_records[0]["request"]["messages"][0]["content"] == "2 + 2?"
    ledgers = [a["metrics"]["details"]["ledger"] for a in answers]
    assert ledgers[0]["input_tokens"] > 0 and ledgers[0]["lm_calls"] == 1
    assert {k: v for k, v in ledgers[0].items() if not k.endswith("_s")} == \
        {k: v for k, v in ledgers[1].items() if not k.endswith("_s")}


def test_a_failed_rollout_is_stored_with_its_error(tmp_path, serve, math_config, api_key,
                                                  mock_policy):
    async def failing(request, ctx):
        raise RuntimeError("the board caught fire")

    body = rollout_body("failed", 3, mock_policy.url + "/v1")
    _, stored = one_stored_rollout(tmp_path, serve, dataclasses.replace(
        math_config, rollout=failing), api_key, body, 500)
    metadata = stored.metadata
    assert (metadata["status"], metadata["run_id"], metadata["request"]) == (
        "error", "failed", body)
    assert metadata["error"]["code"] == "rollout_failed"
    assert "the board caught fire" in metadata["error"]["message"]
    assert "metrics" not in metadata


def full_disk_logs(caplog, server_url: str, api_key: str, rollouts: int, **body) -> list:
    """Send ``rollouts`` rollouts to an app whose trace store is on a full disk; each must be
    a 500 that does not say where the store is. Returns what the server logged."""
    with caplog.at_level(logging.ERROR, logger="synth_deploy.taskapp"):
        with httpx.Client(timeout=30, headers={"X-API-Key": api_key}) as client:
            for i in range(rollouts):
                resp = client.post(server_url + "/rollout", json={
                    "run_id": f"full-{i}", "env": {"seed": 1}, **body})
                assert resp.status_code == 500, resp.text
                error = resp.json()["detail"]["error"]
                assert error["code"] == "trace_write_failed"
                assert "/" not in error["message"], error["message"]  # no path of the server's
    return [r for r in caplog.records if r.name == "synth_deploy.taskapp"]


def test_a_full_disk_fails_each_rollout_and_is_logged_once(serve, api_key, caplog):
    from toy_apps import toy_config

    from synth_deploy.errors import TraceStoreError

    class FullDisk:  # what the kit's store raises when its disk is full
        def start(self):
            pass

        async def write_session(self, session, rollout=None):
            raise TraceStoreError("trace database /srv/secret/traces.db: cannot write: "
                                  "database or disk is full")

    server = serve(create_app(toy_config(), api_keys=[api_key], trace_store=FullDisk()))
    logged = full_disk_logs(caplog, server.url, api_key, 200)
    assert [r.getMessage() for r in logged] == ["trace write failed for rollout full-0"]
    assert "database or disk is full" in logged[0].exc_text or str(logged[0].exc_info[1])


def test_a_real_full_disk_is_logged_once(tmp_path, serve, math_config, api_key, caplog):
    # A 1 MiB tmpfs the store fills: needs the right to mount (root), else skipped.
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)],
                             capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        with open_trace_store(str(disk / "traces.db")) as store:
            server = serve(create_app(math_config, api_keys=[api_key], trace_store=store))
            pad = {"policy": {"config": {"model": "m"}}, "env": {"seed": 1, "config": {
                "pad": "x" * 200_000}}}
            with httpx.Client(timeout=30, headers={"X-API-Key": api_key}) as client:
                while client.post(server.url + "/rollout", json={"run_id": "fill", **pad}
                                  ).status_code != 500:
                    pass  # until the disk is full
            caplog.clear()
            logged = full_disk_logs(caplog, server.url, api_key, 30, **pad)
            server.stop()
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
    assert len(logged) <= 1 and all(r.exc_info is not None for r in logged)


def test_a_failed_trace_write_fails_the_rollout(serve, math_config, api_key, mock_policy,
                                                tmp_path):
    store = open_trace_store(str(tmp_path / "t.db"))
    store.close()  # a closed store refuses writes: the server must not answer 200
    server = serve(create_app(math_config, api_keys=[api_key], trace_store=store))
    [(_, status)] = asyncio.run(fire(server.url, api_key,
                                     [rollout_body("r", 1, mock_policy.url + "/v1")]))
    assert status == 500






@pytest.mark.slow
def test_sigkill_under_load_keeps_every_acknowledged_rollout(tmp_path, mock_policy, api_key):
    path = tmp_path / "traces.db"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-c", SERVER_SCRIPT, str(path), api_key,
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, cwd=str(Path(__file__).resolve().parents[1]))
    try:
        wait_until_up(url, proc)
        bodies = [rollout_body(f"run-{i}", i, mock_policy.url + "/v1") for i in range(3000)]

        async def load_then_kill():
            task = asyncio.create_task(fire(url, api_key, bodies, concurrency=48))
            # Kill once a good number of rollouts have been acknowledged, mid-stream.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not task.done():
                await asyncio.sleep(0.05)
                if _count(path) >= 150:
                    break
            os.kill(proc.pid, signal.SIGKILL)
            return await task

        results = asyncio.run(load_then_kill())
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
    acknowledged = {run for run, status in results if status == 200}
    lost_in_flight = [run for run, status in results if status is None]
    assert len(acknowledged) >= 100 and lost_in_flight, "the kill must land mid-load"
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    # In rows or still in the writer child's journal: the store builds those as it opens.
    with open_trace_store(path, read_only=True) as store:
        stored = {s.run_id for s in store.list_sessions(limit=None)}
    assert acknowledged <= stored, f"missing: {sorted(acknowledged - stored)[:5]}"


def _count(path: Path) -> int:
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
        try:
            return conn.execute("SELECT (SELECT COUNT(*) FROM session_traces) + "
                                "(SELECT COUNT(*) FROM session_journal)").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error:
        return 0


def test_a_server_does_not_start_on_a_file_with_damaged_pages(tmp_path):
    """A file whose schema reads but whose session pages are damaged: `traces ls` refuses
    it, and so does the server, before it answers a rollout 200 into it."""
    from typer.testing import CliRunner

    from synth_deploy.cli import app as cli
    from synth_deploy.env import Env
    from synth_deploy.errors import TraceStoreError
    from synth_deploy.serving import LocalRunner, ServeSettings, server_keys
    from synth_deploy.tracing import SessionTracer, parse_trace_db

    db = tmp_path / "traces.db"
    with open_trace_store(str(db)) as store:
        for i in range(40):
            tracer = SessionTracer(metadata={"app_id": "math", "run_id": f"r{i}"})
            tracer.start_timestep("s", turn_number=1)
            tracer.record_message("user", "x" * 3000)
            store.write_session_sync(tracer.finish())
    pages = db.stat().st_size // 4096
    with open(db, "r+b") as f:  # the last pages (messages, sessions); the schema's intact
        for page in range(pages - 30, pages - 1, 2):
            f.seek(page * 4096 + 100)
            f.write(b"\xff" * 2000)
    damaged = db.read_bytes()
    listed = CliRunner().invoke(cli, ["traces", "ls", "--trace-db", str(db)], env={})
    assert listed.exit_code != 0 and "malformed" in listed.output, listed.output

    env = Env({})
    runner = LocalRunner(ServeSettings(app="math", env=env, keys=server_keys(env, "ephemeral"),
                                       traces=parse_trace_db(str(db))))
    with pytest.raises(TraceStoreError) as refused:
        runner.build()
    assert f"{db} has damaged pages" in refused.value.message
    assert "move it aside" in refused.value.hint
    assert runner.store is None  # closed, not left open
    assert db.read_bytes() == damaged  # left as is
