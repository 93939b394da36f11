"""A sandbox's commands as a stored trace shows them: `traces show`, the viewer's replay
(its JSON and the page in Chromium) and the ledger."""

from __future__ import annotations

import asyncio

import pytest
from typer.testing import CliRunner

from synth_deploy.cli import app as cli_app
from synth_deploy.sandbox import SandboxSettings, open_sandbox
from synth_deploy.tracing import SessionTracer, ledger_of, open_trace_store
from synth_deploy.viewer import create_viewer_app


@pytest.fixture
def stored(tmp_path, local_backend):
    """A stored session whose turn ran a failing test and then one stopped at its limit."""
    tracer = SessionTracer(metadata={"app_id": "code", "model": "m", "seed": 1})
    tracer.start_timestep("turn-1", turn_number=1)

    async def go():
        async with await open_sandbox(SandboxSettings(), app="code", rollout="r",
                                      tracer=tracer, backend=local_backend) as box:
            await box.run("echo 'FAILED (failures=1)' >&2; exit 1")
            await box.run("sleep 10", timeout_s=0.3)

    asyncio.run(go())
    tracer.record_outcome_reward(0.5)
    session = tracer.finish()
    db = tmp_path / "traces.db"
    with open_trace_store(str(db)) as store:
        store.write_session_sync(session)
    return db, session


def test_traces_show_prints_each_command_and_how_it_ended(stored):
    db, session = stored
    shown = CliRunner().invoke(cli_app, ["traces", "show", session.session_id, "--trace-db",
                                         str(db)], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert "sandbox $ echo 'FAILED (failures=1)' >&2; exit 1 → exit 1" in shown.output
    assert "stderr: FAILED (failures=1)" in shown.output
    assert "sandbox $ sleep 10 → exit None · stopped by timeout" in shown.output


def test_the_stored_session_keeps_the_sandbox_time(stored):
    db, session = stored
    with open_trace_store(str(db), read_only=True) as store:
        again = store.get_session(session.session_id)
    assert ledger_of(again).sandbox_s == pytest.approx(ledger_of(session).sandbox_s)
    assert ledger_of(again).sandbox_s >= 0.3


def test_the_viewers_replay_carries_each_command(stored, serve):
    import httpx

    db, session = stored
    with open_trace_store(str(db), read_only=True) as store:
        server = serve(create_viewer_app(store))
        data = httpx.get(f"{server.url}/api/sessions/{session.session_id}").json()
        commands = [e["sandbox"] for e in data["turns"][0]["env_events"] if e["sandbox"]]
        assert [(c["exit_code"], c["limit"]) for c in commands] == [(1, None),
                                                                    (None, "timeout")]
        assert commands[0]["stderr"] == "FAILED (failures=1)\n"


def trace_of(*records: dict) -> dict:
    return {"session_time_steps": [{"events": [
        {"event_type": "runtime", "system_instance_id": "sandbox", "latency_ms": ms,
         "metadata": {"sandbox": record}} for record, ms in records]}]}


def test_the_summary_counts_starts_commands_limits_and_an_open_network():
    from synth_deploy.sandbox import summarize_traces

    blocked = {"id": "a", "backend": "local", "created": {"network": "off"},
               "network": "blocked (a network namespace per command)"}
    open_ = {"id": "b", "backend": "local", "created": {"network": "off"},
             "network": "NOT blocked: this machine does not allow network namespaces"}
    command = {"id": "a", "backend": "local", "command": "x", "limit": "timeout"}
    summary = summarize_traces([trace_of((blocked, 12.0), (command, 1500.0)),
                                trace_of((open_, 30.0)), None, {"nonsense": 1}])
    assert (summary.started, summary.commands, summary.limits["timeout"]) == (2, 1, 1)
    assert summary.start_ms == [12.0, 30.0] and summary.command_s == pytest.approx(1.5)
    assert summary.network_open == 1 and "network namespaces" in summary.hint
    assert "network NOT blocked in 1" in summary.describe()
    assert summarize_traces([trace_of((blocked, 5.0))]).hint is None
