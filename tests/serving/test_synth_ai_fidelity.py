"""A synth-ai trainer drives our server unchanged (issue 11, items 1-3): trace correlation,
what the LM call records hold, and token usage, judged by synth-ai 0.4.4's rules
(tests/synth_ai_rules.py restates them; bench/synth_ai_fidelity.py runs the real ones)."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from synth_ai_rules import correlation_verified, eval_runner_tokens, rl_response_issues
from toy_apps import toy_config

from synth_deploy.serving import create_app
from synth_deploy.taskapp import call_policy
from synth_deploy.taskapp.contracts import RolloutResponse

CID = "trace_abc123"
USAGE = {"prompt_tokens": 21, "completion_tokens": 5, "total_tokens": 26,
         "prompt_tokens_details": {"cached_tokens": 4}}


def recording_policy() -> tuple[Starlette, list[dict]]:
    """An OpenAI-style policy that keeps every request body and answers with ``USAGE``."""
    seen: list[dict] = []

    async def completions(request: Request) -> JSONResponse:
        body = await request.json()
        seen.append({"body": body, "query": dict(request.query_params)})
        reply = f"turn {len(seen)}"
        return JSONResponse({"id": "c", "object": "chat.completion", "model": body["model"],
                             "choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": reply}}],
                             "usage": USAGE})

    # Any path: trainers may put the cid in it (/v1/<trial>/<cid>/chat/completions).
    return Starlette(routes=[Route("/{path:path}", completions, methods=["POST"])]), seen


async def two_turns(request, ctx):
    """A multi-turn rollout that grows one message list, as most agent loops do."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    for turn in (1, 2):
        ctx.tracer.start_timestep(f"turn-{turn}", turn_number=turn)
        reply = await call_policy(ctx, messages)
        messages += [{"role": "assistant", "content": reply.content},
                     {"role": "user", "content": "And again?"}]
        reply.raw["choices"][0]["message"]["content"] = "changed by the app"
    ctx.tracer.record_outcome_reward(1.0)


@pytest.fixture
def policy(serve):
    app, seen = recording_policy()
    server = serve(app)
    server.seen = seen
    return server


@pytest.fixture
def app(serve, api_key):
    return serve(create_app(toy_config(two_turns), api_keys=[api_key]))


def rollout(app, api_key, inference_url, *, return_trace=True, mode="rl", **config):
    body = {"run_id": "run-1", "env": {"seed": 1}, "mode": mode,
            "policy": {"config": {"model": "m", "inference_url": inference_url, **config}},
            "record": {"return_trace": return_trace}}
    resp = httpx.post(app.url + "/rollout", json=body, headers={"X-API-Key": api_key},
                      timeout=30)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_the_cid_of_the_policy_url_is_echoed_where_synth_ai_looks(app, policy, api_key):
    url = f"{policy.url}/v1/chat/completions?cid={CID}"
    data = rollout(app, api_key, url)
    assert rl_response_issues(data) == []
    assert correlation_verified(data, CID)
    assert data["trace_correlation_id"] == CID and data["inference_url"] == url
    assert data["pipeline_metadata"] == {"trace_correlation_id": CID, "inference_url": url}
    assert data["trace"]["metadata"]["correlation_ids"] == {"trace_correlation_id": CID}
    assert [s["query"]["cid"] for s in policy.seen] == [CID, CID]  # the cid reached the policy
    RolloutResponse.model_validate(data)


def test_without_a_trace_the_trainer_can_still_hydrate_it(app, policy, api_key):
    url = f"{policy.url}/v1?cid={CID}"
    data = rollout(app, api_key, url, return_trace=False)
    assert data["trace"] is None
    # The one issue synth-ai reports for any trace-less response; nothing about correlation.
    assert rl_response_issues(data) == ["trace.event_history is missing or empty"]
    assert data["pipeline_metadata"]["inference_url"] == url and correlation_verified(data, CID)


@pytest.mark.parametrize("config, path, expected", [
    ({"trace_correlation_id": "trace_cfg"}, "/v1?cid=trace_url", "trace_cfg"),  # config first
    ({"trace": "trace_legacy"}, "/v1", "trace_legacy"),
    ({}, "/v1/trial-9/trace_in_path/chat/completions", "trace_in_path"),  # OpenAI-SDK style
    ({}, "/v1/chat/completions?trace_correlation_id=trace_q", "trace_q"),
])
def test_the_cid_is_found_in_the_order_synth_ai_reads_it(app, policy, api_key, config,
                                                        path, expected):
    data = rollout(app, api_key, policy.url + path, **config)
    assert data["trace_correlation_id"] == expected
    assert data["trace"]["metadata"]["trace_correlation_id"] == expected


def test_an_eval_without_a_cid_has_none_and_an_app_that_correlates_itself_wins(
        serve, policy, api_key):
    async def own(request, ctx):
        await call_policy(ctx, [{"role": "user", "content": "x"}])
        return {"metrics": {"outcome_reward": 1.0}, "trace_correlation_id": "mine",
                "pipeline_metadata": {"inference_url": "https://elsewhere/v1?cid=mine"}}

    plain = serve(create_app(toy_config(two_turns), api_keys=[api_key]))
    data = rollout(plain, api_key, f"{policy.url}/v1", mode="eval")
    assert data["trace_correlation_id"] is None and "trace_correlation_id" not in \
        data["pipeline_metadata"]
    assert data["pipeline_metadata"]["inference_url"] == f"{policy.url}/v1"
    own_app = serve(create_app(toy_config(own), api_keys=[api_key]))
    data = rollout(own_app, api_key, f"{policy.url}/v1?cid={CID}")
    assert data["trace_correlation_id"] == "mine"
    assert data["pipeline_metadata"] == {"inference_url": "https://elsewhere/v1?cid=mine",
                                         "trace_correlation_id": "mine"}


def test_each_call_record_holds_what_was_sent_and_answered(app, policy, api_key):
    data = rollout(app, api_key, f"{policy.url}/v1?cid={CID}")
    calls = [e for e in data["trace"]["event_history"] if e["event_type"] == "cais"]
    sent = [[m["role"] for m in c["call_records"][0]["request"]["messages"]] for c in calls]
    assert sent == [["system", "user"], ["system", "user", "assistant", "user"]]
    assert sent == [[m["role"] for m in s["body"]["messages"]] for s in policy.seen]
    # The app changed the reply it was handed; the record keeps what the policy said.
    assert [c["call_records"][0]["response"]["content"] for c in calls] == ["turn 1", "turn 2"]


def test_lm_calls_carry_the_policys_usage_and_the_tokens_reach_the_metrics(app, policy,
                                                                           api_key):
    data = rollout(app, api_key, f"{policy.url}/v1?cid={CID}")
    calls = [e for e in data["trace"]["event_history"] if e["event_type"] == "cais"]
    assert [c["usage"] for c in calls] == [USAGE, USAGE]  # as answered, extras included
    assert [(c["input_tokens"], c["output_tokens"], c["total_tokens"]) for c in calls] == \
        [(21, 5, 26)] * 2
    assert eval_runner_tokens(data["trace"]) == 52  # synth-ai's eval runner counts them
    assert data["metrics"]["details"]["tokens"] == 52  # and finds them without a trace
