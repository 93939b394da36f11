"""The math example app: problems, answer parsing, and real episodes through a policy."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "apps" / "math"))
from math_problems import make_problem, parse_answer  # noqa: E402


def test_problems_are_deterministic_tiered_and_split():
    assert make_problem(42) == make_problem(42)
    assert [make_problem(s).difficulty for s in range(3)] == ["easy", "medium", "hard"]
    assert make_problem(5).split == "train" and make_problem(9005).split == "test"
    assert len({make_problem(s).question for s in range(300)}) > 250
    with pytest.raises(LookupError):
        make_problem(10_000)


def test_answers_match_the_arithmetic_in_the_question():
    for seed in range(0, 60, 3):  # easy: "What is a ± b?"
        p = make_problem(seed)
        a, op, b = p.question.removeprefix("What is ").rstrip("?").split()
        assert p.answer == (int(a) + int(b) if op == "+" else int(a) - int(b))


@pytest.mark.parametrize(("text", "value", "formatted"), [
    ("so the total is 12.\nAnswer: 42", 42, True),
    ("Answer: 1,024", 1024, True),
    ("\\boxed{-7}", -7, True),
    ("I think it is 3 or maybe 5", 5, False),
    ("no idea", None, False),
])
def test_parse_answer(text, value, formatted):
    parsed = parse_answer(text)
    assert (parsed.value, parsed.well_formatted) == (value, formatted)


def rollout(server, api_key, seed, inference_url, **env_config):
    return httpx.post(server.url + "/rollout", headers={"X-API-Key": api_key}, timeout=20, json={
        "run_id": f"m-{seed}", "env": {"seed": seed, "config": env_config},
        "policy": {"config": {"model": "test-model", "inference_url": inference_url}},
        "record": {"return_trace": True}})


def test_episode_through_the_mock_policy_keeps_cid_and_scores(math_server, mock_policy, api_key):
    resp = rollout(math_server, api_key, 0, mock_policy.url + "/v1?cid=trace-abc")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    m = body["metrics"]
    expected = make_problem(0).answer
    assert m["details"]["expected"] == expected
    assert m["outcome_reward"] == float(m["details"]["parsed"] == expected)
    assert m["events_score"] == 1.0 and m["event_rewards"] == [1.0]
    assert mock_policy.app.state.correlation_ids == ["trace-abc"]
    trace = body["trace"]
    kinds = [e["event_type"] for e in trace["event_history"]]
    assert kinds == ["cais", "environment"]
    assert trace["event_rewards"][0]["reward_type"] == "answer_format"
    roles = [msg["message_type"] for msg in trace["markov_blanket_message_history"]]
    assert roles == ["system", "user", "assistant"]


def scripted_policy(replies):
    """A policy stand-in that answers from a script and records the prompts it got."""
    prompts = []

    async def completions(request: Request):
        body = await request.json()
        prompts.append(body["messages"])
        return JSONResponse({"model": body["model"], "choices": [{"message": {
            "role": "assistant", "content": replies[len(prompts) - 1]}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 3}})

    app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])
    app.state.prompts = prompts
    return app


def test_an_untagged_reply_gets_one_more_turn(serve, math_server, api_key):
    answer = make_problem(1).answer
    policy = serve(scripted_policy([f"maybe {answer}?", f"Answer: {answer}"]))
    body = rollout(math_server, api_key, 1, policy.url + "/v1").json()
    assert body["metrics"]["num_steps"] == 2 and body["metrics"]["outcome_reward"] == 1.0
    assert body["trace"]["event_rewards"][0]["reward_value"] == 0.0
    assert body["trace"]["event_rewards"][1]["reward_value"] == 1.0
    assert "Answer: <integer>" in policy.app.state.prompts[1][-1]["content"]


def test_a_wrong_answer_scores_zero(serve, math_server, api_key):
    policy = serve(scripted_policy([f"Answer: {make_problem(2).answer + 1}"]))
    m = rollout(math_server, api_key, 2, policy.url + "/v1").json()["metrics"]
    assert m["outcome_reward"] == 0.0 and m["outcome_score"] == 0.0 and m["events_score"] == 1.0


def test_a_dead_policy_is_a_502_naming_the_run(math_server, api_key):
    resp = rollout(math_server, api_key, 3, "http://127.0.0.1:9/v1")
    assert resp.status_code == 502  # the policy failed, not the app
    error = resp.json()["detail"]["error"]
    assert error["code"] == "policy_failed" and "m-3" in error["message"]


def test_a_policy_connection_dropped_before_answering_is_retried(math_server, api_key):
    """The first connection is closed without an answer (a stale keep-alive does this)."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    answer = b'{"choices": [{"message": {"role": "assistant", "content": "Answer: %d"}}]}' % (
        make_problem(6).answer)
    seen = []

    def serve_two():
        for n in range(2):
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(5)
                request = b""
                while b"\r\n\r\n" not in request:
                    request += conn.recv(65536)
                head, _, rest = request.partition(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                while len(rest) < length:
                    rest += conn.recv(65536)
                seen.append(n)
                if n == 0:
                    continue  # hang up without a word
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(answer), answer))

    worker = threading.Thread(target=serve_two, daemon=True)
    worker.start()
    try:
        resp = rollout(math_server, api_key, 6, f"http://127.0.0.1:{port}/v1")
        assert resp.status_code == 200, resp.text
        assert resp.json()["metrics"]["outcome_reward"] == 1.0
        assert seen == [0, 1]
    finally:
        listener.close()
        worker.join(5)


def test_the_math_environment_without_a_seed_asks_new_problems_and_pays_once(math_server,
                                                                           api_key):
    from standins.openenv_client import WSEnvClient

    with WSEnvClient(math_server.url + "/openenv", headers={"X-API-Key": api_key}) as env:
        questions = {env.reset()["observation"]["text"] for _ in range(6)}
        assert len(questions) >= 4  # random train problems: a repeat is rare, not the rule
        env.reset(seed=7)
        answer = make_problem(7).answer
        assert env.step({"answer": answer})["reward"] == 1.0
        again = env.step({"answer": answer})
        assert again["reward"] == 0.0 and again["done"] is True
        assert "reset" in again["observation"]["text"]
