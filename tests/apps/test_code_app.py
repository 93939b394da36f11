"""The code example app: problems, the checker, and episodes whose tests run in a sandbox."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import httpx
import pytest
from processes import run_cli
from standins.scripted_policy import scripted_policy

from synth_deploy.sandbox import LocalBackend, use_backend
from synth_deploy.serving import create_app
from synth_deploy.taskapp.registry import load_app

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "apps" / "code"))
from code_problems import extract_code, make_problem  # noqa: E402


def test_problems_are_deterministic_and_split():
    assert make_problem(42) == make_problem(42)
    assert make_problem(5).split == "train" and make_problem(9005).split == "test"
    assert len({make_problem(s).prompt for s in range(100)}) > 30
    with pytest.raises(LookupError):
        make_problem(10_000)


def test_the_code_is_the_last_python_block():
    assert extract_code("x\n```python\ndef a(): pass\n```\nthen\n```\ndef b(): pass\n```") \
        == "def b(): pass\n"
    assert extract_code("no code here") is None


def served_code(serve, api_key, **sandbox):
    """The code app served; ``sandbox``: its sandbox settings changed."""
    config = load_app("code").build_config()
    if sandbox:
        config = dataclasses.replace(config, sandbox=config.sandbox.updated(**sandbox))
    return serve(create_app(config, api_keys=[api_key]))


@pytest.fixture
def local_sandboxes(sandbox_root):
    use_backend(LocalBackend(sandbox_root))
    yield
    use_backend(None)


@pytest.fixture
def code_server(serve, api_key, local_sandboxes):
    return served_code(serve, api_key)


def episode(server, api_key, policy, seed):
    resp = httpx.post(server.url + "/rollout", headers={"X-API-Key": api_key}, timeout=60,
                      json={"run_id": f"c-{seed}", "env": {"seed": seed},
                            "policy": {"config": {"model": "m",
                                                  "inference_url": policy.url + "/v1"}},
                            "record": {"return_trace": True}})
    assert resp.status_code == 200, resp.text
    return resp.json()


def commands(body) -> list[dict]:
    return [e["metadata"]["sandbox"] for s in body["trace"]["session_time_steps"]
            for e in s["events"] if e["event_type"] == "runtime"
            and "command" in e["metadata"]["sandbox"]]


def solution(seed: int, body: str) -> str:
    p = make_problem(seed)
    return f"Sure.\n```python\ndef {p.name}({p.params}):\n    {body}\n```"


def test_a_correct_function_passes_every_hidden_test(serve, code_server, api_key):
    # seed 2: spread_plus, with its edge case handled
    p = make_problem(2)
    plus = p.doc.split("+ ")[1].split("`")[0]
    policy = serve(scripted_policy([solution(2, f"return max(xs) - min(xs) + {plus} if xs "
                                                f"else {plus}")]))
    body = episode(code_server, api_key, policy, 2)
    assert body["metrics"]["outcome_reward"] == 1.0
    assert body["metrics"]["details"]["passed"] == 5
    ran = commands(body)
    assert [c["command"].split()[0] for c in ran] == ["write_file", "write_file", "python3"]
    assert ran[-1]["exit_code"] == 0
    assert body["metrics"]["details"]["ledger"]["sandbox_s"] > 0


def test_missing_the_edge_case_earns_a_share(serve, code_server, api_key):
    p = make_problem(2)
    plus = p.doc.split("+ ")[1].split("`")[0]
    policy = serve(scripted_policy([solution(2, f"return max(xs) - min(xs) + {plus}")]))
    body = episode(code_server, api_key, policy, 2)
    assert body["metrics"]["outcome_reward"] == pytest.approx(0.8)


def test_printing_fake_results_earns_nothing(serve, code_server, api_key):
    fake = json.dumps([{"value": 0}] * 5)
    policy = serve(scripted_policy([solution(
        0, f"print('\\n' + '0' * 16 + {fake!r}); import os; os._exit(0)")]))
    body = episode(code_server, api_key, policy, 0)
    assert body["metrics"]["outcome_reward"] == 0.0


def test_an_infinite_loop_is_stopped_and_the_trace_says_so(serve, api_key, local_sandboxes):
    # Its commands bounded at 2 s, not the app's 10: the same stop, sooner.
    code_server = served_code(serve, api_key, command_timeout_s=2)
    policy = serve(scripted_policy([solution(0, "while True: pass")]))
    body = episode(code_server, api_key, policy, 0)
    assert body["metrics"]["outcome_reward"] == 0.0
    assert body["metrics"]["details"]["limit"] in ("timeout", "cpu_time")
    assert commands(body)[-1]["limit"] in ("timeout", "cpu_time")


def test_a_reply_without_code_scores_zero_without_a_sandbox(serve, code_server, api_key):
    policy = serve(scripted_policy(["I would rather not."]))
    body = episode(code_server, api_key, policy, 1)
    assert body["metrics"]["outcome_reward"] == 0.0 and body["metrics"]["events_score"] == 0.0
    assert commands(body) == []


def test_smoke_code_passes_with_rewards_from_the_sandboxed_tests(tmp_path):
    result = run_cli(tmp_path, "smoke", "code", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    summary = report["summary"]
    assert summary["rollouts"] == 10 and summary["errors"] == 0
    # The mock writes the asked expression, misses edge cases and slips now and then.
    rewards = [r["reward"] for r in report["rollouts"]]
    assert 0.0 < summary["mean_reward"] < 1.0 and len(set(rewards)) >= 3
    assert summary["ledger"]["sandbox_s"] > 0



def test_the_mock_policy_writes_the_asked_expression_and_slips_now_and_then(mock_policy):
    replies = []
    for seed in range(30):
        problem = make_problem(seed)
        answer = httpx.post(mock_policy.url + "/v1/chat/completions", timeout=10, json={
            "model": "m", "messages": [{"role": "user", "content": problem.prompt}]}).json()
        code = extract_code(answer["choices"][0]["message"]["content"])
        expression = problem.doc.split("`")[1]
        assert code.startswith(f"def {problem.name}({problem.params}):\n")
        replies.append(code.strip().endswith(f"return {expression}"))
    assert 20 <= sum(replies) < 30  # wrong on purpose about one prompt in six
