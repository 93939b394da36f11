"""`smoke`/`eval` against task apps that return synth-ai 0.4.x traces, and against one of ours
sharing the trace file (issue 11, items 3-5): every rollout is kept, every readable trace is
stored once, an unreadable one is a warning on its rollout, and tokens are summed."""

from __future__ import annotations

import json
import sqlite3

import pytest
from processes import run_cli
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from synth_ai_rules import build_trace_payload, session_trace_dict

from synth_deploy.serving import create_app
from synth_deploy.tracing import open_trace_store

KEY = "sk_env_synth_ai_style_" + "0" * 16
COMPLETION = {"choices": [{"message": {"role": "assistant", "content": "Answer: 4"},
                           "finish_reason": "stop"}],
              "usage": {"prompt_tokens": 30, "completion_tokens": 3, "total_tokens": 33}}


def synth_ai_style_app() -> Starlette:
    """A task app answering like synth-ai 0.4.x ones do, one trace shape per seed."""

    async def rollout(request: Request) -> JSONResponse:
        if request.headers.get("x-api-key") != KEY:
            return JSONResponse({"detail": "bad key"}, status_code=401)
        body = await request.json()
        seed, run_id = body["env"]["seed"], body["run_id"]
        url = body["policy"]["config"]["inference_url"]
        trace: dict = {
            # build_trace_payload: the session id only under metadata
            0: build_trace_payload([{"role": "user", "content": "2+2?"}], COMPLETION,
                                   correlation_id=None, session_id=f"helper-{run_id}"),
            # the tracer's own SessionTrace.to_dict()
            1: session_trace_dict(f"v3-{run_id}"),
            # only an event history: no session id anywhere
            2: {"event_history": [{"type": "lm_call", "llm_request": {"messages": []},
                                   "llm_response": {**COMPLETION["choices"][0],
                                                    "usage": COMPLETION["usage"]}}]},
            # a trace nobody can read as a session
            3: {"session_id": f"bad-{run_id}", "outcome_rewards": [{"no_reward": True}]},
        }[seed]
        return JSONResponse({"run_id": run_id, "metrics": {"outcome_reward": 1.0},
                             "trace": trace, "inference_url": url})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"healthy": True})

    return Starlette(routes=[Route("/rollout", rollout, methods=["POST"]),
                             Route("/health", health)])


def stored(db) -> dict[str, dict]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT session_id, metadata FROM session_traces").fetchall()
    return {sid: json.loads(meta) for sid, meta in rows}


@pytest.mark.parametrize("command", ["smoke", "eval"])
def test_every_trace_shape_a_synth_ai_app_returns_is_stored_or_warned(tmp_path, serve,
                                                                     command):
    app = serve(synth_ai_style_app())
    db = tmp_path / "t.db"
    result = run_cli(tmp_path, command, app.url, "--seeds", "0-3", "--trace-db", str(db),
                     "--json", ENVIRONMENT_API_KEY=KEY)
    assert result.returncode == 0, result.stderr  # no rollout lost, no crash
    report = json.loads(result.stdout)
    outcomes = {r["seed"]: r for r in report["rollouts"]}
    assert all(r["ok"] for r in outcomes.values()) and report["summary"]["errors"] == 0
    assert [outcomes[s]["warning"] is None for s in range(4)] == [True, True, True, False]
    assert "its trace was not stored" in outcomes[3]["warning"]
    assert report["summary"]["warnings"] == 1
    sessions = stored(db)
    run_ids = {s: outcomes[s]["run_id"] for s in range(4)}
    assert set(sessions) == {f"helper-{run_ids[0]}", f"v3-{run_ids[1]}", run_ids[2]}
    # What the rollout told us fills what the trace left out.
    assert sessions[run_ids[2]]["seed"] == 2 and sessions[run_ids[2]]["status"] == "ok"
    # Tokens as synth-ai's eval runner counts them, per rollout and in the summary.
    assert [outcomes[s]["tokens"] for s in range(4)] == [33, 14, 33, None]
    assert report["summary"]["tokens"] == 80


def test_the_table_shows_the_warning_and_the_tokens(tmp_path, serve):
    app = serve(synth_ai_style_app())
    result = run_cli(tmp_path, "smoke", app.url, "--seeds", "2-3", "--trace-db",
                     str(tmp_path / "t.db"), ENVIRONMENT_API_KEY=KEY)
    assert result.returncode == 0, result.stderr
    assert "1 warning:" in result.stdout and "its trace was not stored" in result.stdout
    assert "33 tokens" in result.stdout


def test_smoke_url_of_an_app_tracing_into_the_same_file_stores_each_session_once(
        tmp_path, serve, math_config):
    db = tmp_path / "traces" / "v3" / "synth_ai.db"  # the default both sides resolve
    with open_trace_store(db) as store:
        app = serve(create_app(math_config, api_keys=[KEY], trace_store=store))
        result = run_cli(tmp_path, "smoke", app.url, "--seeds", "0-5", "--json",
                         ENVIRONMENT_API_KEY=KEY)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["summary"]["errors"] == 0 and report["summary"]["warnings"] == 0
    assert len(stored(db)) == 6
    assert report["summary"]["tokens"] == sum(r["tokens"] for r in report["rollouts"]) > 0
