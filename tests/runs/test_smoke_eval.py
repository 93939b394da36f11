"""`smoke` and `eval` end to end: real child processes, real servers, real SQLite traces."""

from __future__ import annotations

import json
import sqlite3

import pytest
from processes import refused_in_process, run_cli

from synth_deploy.cli._common import parse_seeds
from synth_deploy.errors import UsageError
from synth_deploy.runs import PolicyTarget, RunOptions, RunTarget, run_seeds


def sessions(db) -> list[dict]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT metadata FROM session_traces").fetchall()
    return [json.loads(r[0]) for r in rows]


def test_smoke_math_serves_runs_ten_rollouts_and_traces_them(tmp_path):
    result = run_cli(tmp_path, "smoke", "math", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    summary = report["summary"]
    assert summary["rollouts"] == 10 and summary["errors"] == 0
    assert [r["seed"] for r in report["rollouts"]] == list(range(10))
    # The mock policy solves explicit arithmetic and mostly misses word problems.
    assert 0.0 < summary["mean_reward"] < 1.0
    assert summary["latency_p50_s"] <= summary["latency_p95_s"]
    assert any("ephemeral key" in note for note in report["notes"])
    db = tmp_path / "traces" / "v3" / "synth_ai.db"
    assert report["traces"].startswith(str(db.relative_to(tmp_path)))
    stored = sessions(db)
    assert sorted(s["run_id"] for s in stored) == sorted(r["run_id"] for r in report["rollouts"])
    assert {s["mode"] for s in stored} == {"rl"}


def test_smoke_table_for_humans(tmp_path):
    result = run_cli(tmp_path, "smoke", "math", "--seeds", "0,3,5-6", "--no-trace")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for word in ("seed", "reward", "latency", "4 rollouts (rl), 0 errors", "mean reward", "p95"):
        assert word in out
    assert "traces → off" in out
    assert not (tmp_path / "traces").exists()


def test_eval_math_twenty_seeds_writes_twenty_traces(tmp_path):
    result = run_cli(tmp_path, "eval", "math", "--seeds", "0-19", "--policy", "mock")
    assert result.returncode == 0, result.stderr
    assert "20 rollouts (eval), 0 errors" in result.stdout
    assert "outcome" in result.stdout and "events" in result.stdout
    stored = sessions(tmp_path / "traces" / "v3" / "synth_ai.db")
    assert len(stored) == 20 and {s["mode"] for s in stored} == {"eval"}
    assert sorted(s["seed"] for s in stored) == list(range(20))


def test_eval_split_uses_the_apps_default_seeds(tmp_path):
    result = run_cli(tmp_path, "eval", "math", "--split", "test", "--json", "--no-trace")
    assert result.returncode == 0, result.stderr
    seeds = [r["seed"] for r in json.loads(result.stdout)["rollouts"]]
    assert seeds == list(range(9000, 9050))


def test_eval_without_split_or_seeds_runs_the_apps_default_split(tmp_path, math_server,
                                                                 api_key):
    # The help promises the split's default seeds: math declares "train" with seeds 0-99.
    for target in ("math", math_server.url):
        result = run_cli(tmp_path, "eval", target, "--json", "--no-trace",
                         ENVIRONMENT_API_KEY=api_key)
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        assert [r["seed"] for r in report["rollouts"]] == list(range(100)), target
        assert any("default split 'train'" in n for n in report["notes"])


def test_eval_without_a_declared_default_split_runs_seeds_0_to_9(tmp_path):
    (tmp_path / "tiny.py").write_text(
        "from synth_deploy.taskapp import TaskApp\n"
        "task_app = TaskApp('tiny', name='Tiny', description='No datasets.')\n\n"
        "@task_app.rollout\nasync def rollout(request, ctx):\n"
        "    ctx.tracer.record_outcome_reward(1.0)\n")
    result = run_cli(tmp_path, "eval", "tiny.py", "--json", "--no-trace")
    assert result.returncode == 0, result.stderr
    assert [r["seed"] for r in json.loads(result.stdout)["rollouts"]] == list(range(10))


def test_a_rollout_that_records_no_reward_is_a_warning_not_a_zero(tmp_path):
    (tmp_path / "none.py").write_text(
        "from synth_deploy.taskapp import TaskApp\n"
        "task_app = TaskApp('none', name='None', description='No reward.')\n\n"
        "@task_app.rollout\nasync def rollout(request, ctx):\n"
        "    if request.env.seed:\n"
        "        ctx.tracer.record_outcome_reward(0.0)\n")
    result = run_cli(tmp_path, "smoke", "none.py", "--seeds", "0-1", "--json", "--no-trace")
    assert result.returncode == 0, result.stderr
    unrewarded, rewarded = json.loads(result.stdout)["rollouts"]
    assert unrewarded["reward"] is None and "no reward recorded" in unrewarded["warning"]
    assert rewarded["reward"] == 0.0 and rewarded["warning"] is None  # a reward of 0 is one
    human = run_cli(tmp_path, "eval", "none.py", "--seeds", "0", "--no-trace")
    assert "1 warning" in human.stdout and "no reward recorded" in human.stdout, human.stdout


def test_eval_against_a_url_stores_the_returned_traces(tmp_path, math_server, api_key):
    db = tmp_path / "remote-evals.db"
    result = run_cli(tmp_path, "eval", math_server.url, "--seeds", "1-5", "--trace-db", str(db),
                     "--json", ENVIRONMENT_API_KEY=api_key)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["summary"]["ok"] == 5
    stored = sessions(db)
    assert sorted(s["seed"] for s in stored) == [1, 2, 3, 4, 5]


def test_smoke_and_eval_take_the_keyed_apps_key_as_api_key(tmp_path, math_server, api_key):
    # No ENVIRONMENT_API_KEY anywhere: the flag is the key, as `check --api-key` takes it.
    for command in ("smoke", "eval"):
        result = run_cli(tmp_path, command, math_server.url, "--seeds", "0-1", "--api-key",
                         api_key, "--json", "--no-trace")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["summary"]["ok"] == 2, command
        assert api_key not in result.stdout + result.stderr
    wrong = run_cli(tmp_path, "smoke", math_server.url, "--seeds", "0", "--api-key",
                    "sk_env_wrong", "--json", "--no-trace", ENVIRONMENT_API_KEY=api_key)
    assert wrong.returncode == 1  # the flag wins over the environment's key
    assert "does not match" in json.loads(wrong.stdout)["rollouts"][0]["error"]


def test_a_dead_policy_fails_every_rollout_with_exit_1(tmp_path):
    result = run_cli(tmp_path, "smoke", "math", "--seeds", "0-2", "--inference-url",
                     "http://127.0.0.1:9/v1", "--model", "m", "--json", "--no-trace")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["summary"]["errors"] == 3
    assert all("did not answer" in r["error"] for r in report["rollouts"])
    shown = run_cli(tmp_path, "smoke", "math", "--seeds", "0", "--inference-url",
                    "http://127.0.0.1:9/v1", "--model", "m", "--no-trace").stdout
    assert "p50 n/a (no rollout finished)" in " ".join(shown.split()) and "-s" not in shown


def test_the_load_table_shows_slow_rollouts_per_second_not_zero():
    from rich.console import Console

    from synth_deploy.cli._common import load_table

    console = Console(width=80, record=True)
    console.print(load_table([{"concurrency": 1, "rollouts": 2, "errors": 0, "p50_s": 45.0,
                               "p99_s": 45.2, "rollouts_per_s": 0.0222, "problem": None}],
                             width=80))
    row = console.export_text().splitlines()[-2]
    assert "0.022" in row and " 0.0 " not in row, row


@pytest.mark.parametrize(("args", "message"), [
    (["smoke", "math", "--seeds", "9-1"], "runs backwards"),
    (["smoke", "math", "--seeds", "a-b"], "not a number or range"),
    (["smoke", "math", "--inference-url", "ftp://x", "--model", "m"], "http(s) URL"),
    (["smoke", "math", "--inference-url", "http://127.0.0.1:9/v1"], "needs --model"),
    (["smoke", "http://127.0.0.1:9"], "no ENVIRONMENT_API_KEY"),
    (["smoke", "http://127.0.0.1:abc"], "has an invalid port"),
    (["eval", "http://[::1", "--split", "test"], "is not a URL"),
    (["smoke", "nosuchapp"], "no task app with id"),
    (["smoke", "math", "--api-key", "k"], "served here with a key of its own"),
    (["eval", "math", "--split", "validation"], "no default seeds for split"),
])
def test_bad_input_is_a_usage_error_with_the_fix(tmp_path, args, message):
    result = refused_in_process(tmp_path, *args, "--no-trace")
    assert result.exit_code == 2, result.output
    # a usage error, not an exception escaping the command
    assert message in result.stderr and isinstance(result.exception, SystemExit)


@pytest.mark.parametrize(("text", "seeds"), [
    ("0-9", list(range(10))), ("1,3,5", [1, 3, 5]), ("0-2,10,12-13", [0, 1, 2, 10, 12, 13]),
    ("5,5,4-5", [5, 4]), (" 7 ", [7]),
])
def test_parse_seeds(text, seeds):
    assert parse_seeds(text) == seeds


def test_parse_seeds_rejects_empty():
    with pytest.raises(UsageError):
        parse_seeds(",")


def test_runner_caps_concurrency_for_a_quick_tunnel():
    target = RunTarget("https://calm-river-1234.trycloudflare.com", "k",
                       PolicyTarget("http://127.0.0.1:9/v1", "m"), local=False)
    report = run_seeds(target, [], RunOptions(concurrency=500))
    assert report.concurrency < 500
    assert any("trycloudflare" in note or "quick tunnel" in note for note in report.notes)
    plain = run_seeds(RunTarget("http://127.0.0.1:9", "k", target.policy, local=False), [],
                      RunOptions(concurrency=500))
    assert plain.concurrency == 500



ENV_READING_APP = """
import os
from synth_deploy.taskapp import TaskDescriptor, TaskInfo
from synth_deploy.taskapp.config import TaskAppConfig
from synth_deploy.taskapp.registry import register_task_app

async def rollout(request, ctx):
    reward = float(os.environ["TOY_REWARD"])  # a setting the app reads from its environment
    return {"run_id": request.run_id, "metrics": {"episode_rewards": [reward]}}

register_task_app(app_id="envtoy", config_factory=lambda: TaskAppConfig(
    app_id="envtoy", name="E", description="reads env",
    base_task_info=TaskInfo(task=TaskDescriptor(id="envtoy", name="E")),
    provide_task_instances=lambda seeds: [], rollout=rollout))
"""


def test_a_locally_served_app_sees_the_env_file_as_under_serve(tmp_path):
    (tmp_path / "env_app.py").write_text(ENV_READING_APP)
    (tmp_path / "settings.env").write_text("TOY_REWARD=0.25\n")
    result = run_cli(tmp_path, "smoke", "env_app.py", "--seeds", "0-1", "--env-file",
                     "settings.env", "--json", "--no-trace")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["summary"]["mean_reward"] == 0.25


def test_the_mock_policy_serves_on_its_own_for_curl_or_a_trainer(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    import httpx
    from processes import clean_env, free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "synth_deploy.cli", "mock-policy", "--port",
                             str(port)], cwd=tmp_path, env=clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        deadline = time.monotonic() + 20
        while True:
            try:
                answer = httpx.post(url, json={"model": "m", "messages": [
                    {"role": "user", "content": "What is 2 + 3?"}]}, timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
                time.sleep(0.2)
        assert answer.status_code == 200
        assert "Answer:" in answer.json()["choices"][0]["message"]["content"]
        # OpenAI clients list the models first.
        listed = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5)
        assert listed.status_code == 200, listed.text
        assert [m["id"] for m in listed.json()["data"]] == ["synth-deploy/mock-policy"]
        assert listed.json()["object"] == "list"
        one = httpx.get(f"http://127.0.0.1:{port}/v1/models/synth-deploy/mock-policy", timeout=5)
        assert one.json()["id"] == "synth-deploy/mock-policy"
        other = httpx.get(f"http://127.0.0.1:{port}/v1/models/gpt-4", timeout=5)
        assert other.status_code == 404 and "synth-deploy/mock-policy" in other.text
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0 and f"mock policy at http://127.0.0.1:{port}/v1" in err
