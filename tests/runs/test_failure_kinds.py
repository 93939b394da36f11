"""Every failed rollout says who failed and whether a retry may help (the server classifies
it; `smoke`/`eval` report it, retry only what is retryable, and stop a run that fails every
seed alike). Real child processes, real servers, real SQLite traces."""

from __future__ import annotations

import json
import socket
import sqlite3
import textwrap

from processes import run_cli
from toy_apps import raising_rollout, toy_config

from synth_deploy.health import CheckOptions, RolloutOptions, check
from synth_deploy.serving import create_app
from synth_deploy.tracing import browse_sessions, open_trace_store

APP = '''
from synth_deploy.errors import BadRequest
from synth_deploy.taskapp import TaskApp, call_policy

task_app = TaskApp("kinds", name="Kinds", description="fails as its seed says")


@task_app.rollout
async def rollout(request, ctx):
    seed = request.env.seed
    if seed == 1:
        raise RuntimeError("the environment broke")
    if seed == 2:
        raise BadRequest("seed 2 wants a config it was not given", field="env.config.x")
    await call_policy(ctx, [{"role": "user", "content": "1+1?"}])
    ctx.tracer.record_outcome_reward(1.0)
'''


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def smoke_json(tmp_path, *args: str) -> dict:
    (tmp_path / "kinds.py").write_text(textwrap.dedent(APP))
    result = run_cli(tmp_path, "smoke", "kinds.py", "--json", *args)
    assert result.returncode == 1, result.stderr  # failed rollouts: exit 1
    return json.loads(result.stdout)


def test_each_failure_says_who_failed_and_whether_a_retry_may_help(tmp_path):
    report = smoke_json(tmp_path, "--seeds", "0-2")
    by_seed = {r["seed"]: r for r in report["rollouts"]}
    assert by_seed[0]["ok"] is True and by_seed[0]["kind"] is None
    environment, client = by_seed[1], by_seed[2]
    assert (environment["kind"], environment["retryable"], environment["attempts"]) == (
        "environment", False, 1)
    assert (client["kind"], client["retryable"], client["status"]) == ("client", False, 422)
    assert report["summary"]["failure_kinds"] == {"environment": 1, "client": 1}
    # The stored session carries the same classification.
    with sqlite3.connect(tmp_path / "traces" / "v3" / "synth_ai.db") as conn:
        errors = {json.loads(m)["seed"]: json.loads(m).get("error") for (m,) in conn.execute(
            "SELECT metadata FROM session_traces")}
    assert errors[1]["kind"] == "environment" and errors[1]["retryable"] is False
    assert errors[2]["kind"] == "client"
    # The viewer's rows (and replay) say who failed before what.
    with open_trace_store(tmp_path / "traces" / "v3" / "synth_ai.db", create=False) as store:
        shown = {r.seed: r.error for r in browse_sessions(store).rows}
    assert shown[1].startswith("[environment] rollout ") and shown[0] is None
    assert shown[2].startswith("[client] ")


def test_check_says_who_failed_its_rollout(serve, mock_policy, api_key):
    app = serve(create_app(toy_config(raising_rollout), api_keys=[api_key]))
    report = check(app.url, api_key, CheckOptions(seeds=(0,), rollout=RolloutOptions(
        inference_url=mock_policy.url + "/v1", model="mock")))
    failed = report.to_dict()["failure"]
    assert failed["name"] == "rollout" and failed["code"] == "rollout_failed"
    assert failed["actual"].endswith("[environment]"), failed


def test_an_unreachable_policy_is_the_networks_retried_once_then_the_run_stops(tmp_path):
    url = f"http://127.0.0.1:{closed_port()}/v1"
    report = smoke_json(tmp_path, "--seeds", "0,3-9", "--concurrency", "1", "--stop-after",
                        "3", "--inference-url", url, "--model", "m", "--no-trace")
    rollouts = report["rollouts"]
    assert len(rollouts) == 3  # stopped after three in a row: five seeds never ran
    for rollout in rollouts:
        assert (rollout["kind"], rollout["retryable"], rollout["attempts"]) == (
            "network", True, 2), rollout
        assert rollout["status"] == 502
    assert report["summary"]["stopped"].startswith(
        "stopped after 3 failed rollouts in a row (network 3)")
    assert "5 seeds not run" in report["summary"]["stopped"]


def test_the_table_names_the_kind_and_the_stop(tmp_path):
    (tmp_path / "kinds.py").write_text(textwrap.dedent(APP))
    result = run_cli(tmp_path, "eval", "kinds.py", "--seeds", "1,2,0,3", "--concurrency", "1",
                     "--stop-after", "2", "--no-trace")
    assert result.returncode == 1
    out = " ".join(result.stdout.split())
    assert "[environment]" in out and "[client]" in out
    assert "by kind: environment 1, client 1" in out
    assert "stopped after 2 failed rollouts in a row (environment 1, client 1); 2 seeds " \
           "not run" in out
