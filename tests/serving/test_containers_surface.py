"""synth-containers' whole surface under /containers, each shape as its client and reference
app have it (bench/synth_containers_fidelity.py checks the same against synth-containers'
own code; nothing of it is imported here): root, capabilities and compatibility, the error
bodies, failed documents, datasets' splits and pages, token ids and the trace in the
document, the event envelope, prepare, the rollout's views, and the not-supported routes.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from toy_apps import toy_config

from synth_deploy.runs import create_mock_policy_app
from synth_deploy.serving import create_app
from synth_deploy.serving.containers import envelope_digest as digest
from synth_deploy.serving.containers import rollout_answer
from synth_deploy.taskapp import RolloutContext, RolloutRequest, TaskDataset, call_policy

# What synth-containers' client and reference app call for pause, checkpoints, resume, fork
# and annotations (its http_client.py and http_adapter.py), and the name each 404 gives.
UNSUPPORTED = [("POST", "/rollouts/r/pause", "pause"),
               ("POST", "/rollouts/r/checkpoints", "checkpoints"),
               ("GET", "/rollouts/r/checkpoints", "checkpoints"),
               ("GET", "/rollouts/r/checkpoints/c", "checkpoints"),
               ("GET", "/checkpoints", "checkpoints"),
               ("GET", "/checkpoints/c", "checkpoints"),
               ("POST", "/checkpoints/c/labels", "checkpoints"),
               ("GET", "/checkpoints/c/export", "export_checkpoint"),
               ("POST", "/checkpoints/import", "import_checkpoint"),
               ("POST", "/rollouts/r/resume", "resume"),
               ("POST", "/rollouts/r/resume_async", "resume"),
               ("POST", "/rollouts/r/fork", "fork"),
               ("GET", "/rollouts/r/annotations", "annotations")]


def client(app, api_key: str) -> httpx.Client:
    return httpx.Client(base_url=app.url + "/containers", timeout=30,
                        headers={"X-API-Key": api_key})


async def asking(request: RolloutRequest, ctx: RolloutContext) -> dict:
    await call_policy(ctx, [{"role": "user", "content": "What is 2 + 2?"}])
    ctx.tracer.record_outcome_reward(1.0)
    return {"run_id": request.run_id, "metrics": {}}


def sleeping(request: RolloutRequest, ctx: RolloutContext):
    return asyncio.sleep(30)


def rollout_body(rollout_id: str, policy_url: str | None = None, **extra) -> dict:
    policy = {"model": "mock"} | ({"inference_url": policy_url} if policy_url else {})
    return {"rollout_id": rollout_id, "seed": 3, "policy": policy, **extra}


def test_root_and_capabilities_say_what_the_app_can_do(serve, api_key):
    plain = serve(create_app(toy_config(), api_keys=[api_key]))
    capturing = serve(create_app(toy_config(capture_tokens=True), api_keys=[api_key]))
    with client(plain, api_key) as c:
        root = c.get("/")
        caps = c.get("/metadata").json()["capabilities"]
        off = c.get("/compatibility", params={"target": "pipeline_rl_token_ids"}).json()
        matrix = c.get("/compatibility").json()
        bad_target = c.get("/compatibility", params={"target": "nope"})
        catalog = c.get("/task_catalog").json()
    with client(capturing, api_key) as c:
        on_caps = c.get("/metadata").json()["capabilities"]
        on = c.get("/compatibility", params={"target": "pipeline_rl_token_ids"}).json()
    assert root.status_code == 200 and root.json()["status"] == "ok"
    assert root.json()["runtime"]["capabilities"]["protocol"] == "synth.container.contract.v1"
    assert root.json()["task_info"]["task"]["task_id"] == "toy"
    # What the kit cannot do is declared false; what it does, true.
    assert [caps[k] for k in ("pause_support", "checkpoint_support", "resume_support",
                              "supports_branching")] == [False] * 4
    assert [caps[k] for k in ("trace_support", "reward_support", "terminate_support",
                              "state_support", "proxied_inference")] == [True] * 5
    assert caps["route_hints"]["pause_routes"] == [] == caps["route_hints"]["resume_routes"]
    assert caps["token_emission"]["token_ids"] is False
    assert off["supported"] is False and "token_ids" in off["missing_features"]
    assert "token_trace_emitting" in off["missing_protocols"]
    assert matrix["pipeline_rl"]["supported"] is True and matrix["go_ex"]["supported"] is False
    assert bad_target.status_code == 400
    assert bad_target.json()["detail"].startswith("invalid_compatibility_target:nope")
    assert catalog["catalog_id"] == "toy" and catalog["tasks"][0]["task_name"] == "Toy"
    assert set(root.json()["task_info"]) == {"task", "dataset", "capabilities", "limits",
                                             "inference", "task_metadata", "environment",
                                             "metadata", "resource_refs"}
    # With capture on, the token-level consumer is served.
    assert on_caps["token_emission"] == {**caps["token_emission"], "token_ids": True,
                                         "logprobs": True}
    assert "token_level_rl_environment" in on_caps["profiles"]
    assert on == {"target": "pipeline_rl_token_ids", "supported": True, "missing_profiles": [],
                  "missing_protocols": [], "missing_protocol_groups": [],
                  "missing_features": [], "issues": [], "notes": []}


def test_unknown_rollouts_and_conflicts_answer_the_contracts_bodies(serve, api_key):
    app = serve(create_app(toy_config(), api_keys=[api_key]))
    with client(app, api_key) as c:
        for method, path in [("GET", ""), ("GET", "/state"), ("GET", "/events"),
                             ("GET", "/summary"), ("GET", "/usage"), ("GET", "/trace"),
                             ("GET", "/artifacts"), ("GET", "/reward"),
                             ("GET", "/stream"), ("POST", "/terminate"), ("POST", "/renew")]:
            resp = c.request(method, "/rollouts/nobody" + path)
            assert (resp.status_code, resp.json()) == (404, {"detail": "unknown_rollout:nobody"}
                                                        ), path


def test_each_route_for_what_the_kit_cannot_do_is_the_contracts_not_supported(serve,
                                                                               api_key):
    app = serve(create_app(toy_config(), api_keys=[api_key]))
    with client(app, api_key) as c:
        for method, path, name in UNSUPPORTED:
            resp = c.request(method, path, json={} if method == "POST" else None)
            assert resp.status_code == 404, path
            assert resp.json() == {"detail": f"container_route_not_supported:{name}"}, path
        assert c.get("/program").json() == {"detail": "container_route_not_supported:program"}
        # A GET the route by id would take is the wrong method on a POST-only path.
        for path in ("/rollouts/prepare", "/checkpoints/import"):
            resp = c.get(path)
            assert (resp.status_code, resp.headers["allow"]) == (405, "POST"), path
        named = c.post("/rollouts", json={"rollout_id": "prepare"})
        assert named.json()["detail"]["error"]["errors"][0]["path"] == "rollout_id"


def test_a_failed_sync_rollout_is_answered_as_its_document(serve, api_key):
    app = serve(create_app(toy_config(asking), api_keys=[api_key]))
    with client(app, api_key) as c:
        resp = c.post("/rollouts", json=rollout_body("f-1"))  # no inference_url
        again = c.post("/rollouts", json=rollout_body("f-1"))
    assert resp.status_code == 200  # the client reads the failure; it does not raise
    doc = resp.json()
    assert doc["status"] == "failed" and doc["success_status"] == "failed"
    assert doc["error"]["code"] == "missing_inference_url" and doc["error"]["status"] == 422
    assert again.status_code == 200 and again.json()["replayed"] is True
    # The kit's own runners still read it as /rollout would have answered.
    assert rollout_answer(doc)[0] == 422


def not_a_number(request: RolloutRequest, ctx: RolloutContext) -> dict:
    # A state the environment scored NaN (a reward of NaN is refused where it is said).
    ctx.tracer.record_environment_event(reward=1.0, state_after={"score": float("nan"),
                                                                 "by_room": {1: 0.5}})
    return {"run_id": request.run_id, "metrics": {"episode_rewards": [1.0]}}


def test_a_document_holding_nan_is_read_with_null_in_its_place(serve, api_key):
    # JSON has no NaN: a NaN the environment reported reads as null, as pydantic writes it.
    app = serve(create_app(toy_config(not_a_number), api_keys=[api_key]))
    trace = {"record": {"return_trace": True}}
    with client(app, api_key) as c:
        sync = c.post("/rollouts", json=rollout_body("nan-1", **trace))
        assert c.post("/rollouts", json=rollout_body("nan-2", submission_mode="async", **trace)
                      ).status_code == 202
        while (read := c.get("/rollouts/nan-2")).status_code == 200 and \
                read.json()["status"] == "running":
            time.sleep(0.02)
    for resp in (sync, read):
        assert resp.status_code == 200, resp.text
        event = resp.json()["trace"]["session_time_steps"][0]["events"][0]
        assert event["system_state_after"] == {"score": None, "by_room": {"1": 0.5}}


def test_terminate_answers_once_the_rollout_is_cancelled(serve, api_key):
    app = serve(create_app(toy_config(sleeping), api_keys=[api_key]))
    with client(app, api_key) as c:
        assert c.post("/rollouts", json=rollout_body("t-1", submission_mode="async")
                      ).status_code == 202
        asked = time.monotonic()
        resp = c.post("/rollouts/t-1/terminate", json={"reason": "done with it"})
        state = c.get("/rollouts/t-1/state").json()
    assert time.monotonic() - asked < 5
    assert resp.status_code == 200 and resp.json()["status"] == "cancelled"
    assert resp.json()["control"]["terminate_supported"] is True
    assert resp.json()["control"]["pause_supported"] is False
    assert state["status"] == "cancelled" and state["error"]["code"] == "terminated"


def test_splits_count_their_seeds_and_page_with_offset_and_limit(serve, api_key):
    config = toy_config()
    config.dataset_registry.register(TaskDataset(
        id="toy", splits=("train", "test"), seeds=range(0, 30),
        split_seeds={"train": range(0, 25), "test": range(25, 30)}))
    app = serve(create_app(config, api_keys=[api_key]))
    with client(app, api_key) as c:
        splits = c.get("/taskset").json()["splits"]
        default = c.post("/taskset/tasks", json={}).json()
        train = c.post("/taskset/tasks", json={"split": "train", "offset": 20,
                                                "limit": 10}).json()
        test = c.post("/dataset/rows", json={"split": "test", "limit": 2}).json()
        by_seed = c.post("/taskset/tasks", json={"task_ids": ["seed:27", 3]}).json()
        unknown = c.post("/taskset/tasks", json={"split": "validation"})
        negative = c.post("/taskset/tasks", json={"split": "train", "offset": -1})
        too_many = c.post("/taskset/tasks", json={"limit": 5000})
    assert splits == [{"name": "train", "count": 25}, {"name": "test", "count": 5}]
    assert len(default["rows"]) == 25 and default["total"] == 25  # the first split's page
    assert default["split"] == "train"
    assert [r["seed"] for r in train["rows"]] == [20, 21, 22, 23, 24]
    assert (train["total"], train["offset"], train["next_offset"]) == (25, 20, None)
    assert [(r["seed"], r["split"]) for r in test["rows"]] == [(25, "test"), (26, "test")]
    assert test["next_offset"] == 2
    assert [(r["seed"], r["split"], r["task_id"]) for r in by_seed["rows"]] == [
        (27, "test", "seed:27"), (3, "train", "seed:3")]
    assert unknown.status_code == 404
    assert unknown.json()["detail"]["error"]["errors"][0]["path"] == "split"
    assert negative.status_code == 422
    assert too_many.status_code == 422
    assert too_many.json()["detail"]["error"]["errors"][0]["path"] == "limit"


def test_split_seeds_must_name_the_datasets_splits():
    with pytest.raises(ValueError, match="split_seeds names \\['dev'\\]"):
        TaskDataset(id="toy", splits=("train",), split_seeds={"dev": range(3)})


def test_a_split_whose_seeds_are_not_declared_has_no_count_and_no_pages(serve, api_key):
    config = toy_config()
    config.dataset_registry.register(TaskDataset(id="toy", splits=("train", "test"),
                                                 seeds=range(0, 30)))
    app = serve(create_app(config, api_keys=[api_key]))
    with client(app, api_key) as c:
        splits = c.get("/dataset").json()["splits"]
        page = c.post("/taskset/tasks", json={"split": "test"})
        rows = c.post("/taskset/tasks", json={"seeds": [4]}).json()["rows"]
    assert splits == [{"name": "train", "count": None}, {"name": "test", "count": None}]
    assert page.status_code == 422 and "split_seeds" in page.json()["detail"]["error"]["message"]
    assert rows[0]["seed"] == 4


def test_captured_tokens_the_trace_and_the_correlation_id_are_in_the_document(
        serve, api_key):
    policy = serve(create_mock_policy_app())
    capturing = serve(create_app(toy_config(asking, capture_tokens=True), api_keys=[api_key]))
    plain = serve(create_app(toy_config(asking), api_keys=[api_key]))
    url = policy.url + "/v1"
    with client(capturing, api_key) as c:
        doc = c.post("/rollouts", json=rollout_body("k-1", url)).json()
        usage = c.get("/rollouts/k-1/usage").json()
        trace = c.get("/rollouts/k-1/trace").json()
        summary = c.get("/rollouts/k-1/summary").json()
        artifacts = c.get("/rollouts/k-1/artifacts").json()
        rewards = [c.get("/rollouts/k-1/reward").json(),
                   c.get("/reward", params={"rollout_id": "k-1"}).json(),
                   c.post("/reward", json={"rollout_id": "k-1"}).json()]
        provisional = c.post("/reward", json={"rollout_id": "k-1", "mode": "provisional"})
    with client(plain, api_key) as c:
        bare = c.post("/rollouts", json=rollout_body("k-2", url,
                                                     trace_correlation_id="cid-7")).json()
    assert doc["status"] == "completed"
    [turn] = doc["turns"]
    assert turn["token_ids"] and turn["prompt_token_ids"]
    assert len(turn["token_logprobs"]) == len(turn["token_ids"])
    assert doc["trace"]["event_history"] and "trace" not in doc["response"]  # kept once
    assert rollout_answer(doc)[1]["trace"] == doc["trace"]
    assert doc["trace_correlation_id"] == "k-1" == trace["rollout_id"]
    assert trace["event_history"] == doc["trace"]["event_history"]
    assert usage["usage"]["total_tokens"] > 0 and usage["usage"]["lm_calls"] == 1
    assert summary["outcome_reward"] == 1.0 and summary["summary"]["outcome_reward"] == 1.0
    assert artifacts == {"rollout_id": "k-1", "artifacts": []}
    assert [r["status"] for r in rewards] == ["scored"] * 3
    assert {r["reward"] for r in rewards} == {1.0}
    assert provisional.status_code == 409
    # Without capture nothing is traced into the answer; the caller's correlation id is kept.
    assert bare["turns"] == [] and bare["trace"] == {}
    assert bare["trace_correlation_id"] == "cid-7"
    assert bare["response"]["trace_correlation_id"] == "cid-7"


def test_events_are_the_contracts_envelopes(serve, api_key):
    app = serve(create_app(toy_config(), api_keys=[api_key]))
    with client(app, api_key) as c:
        c.post("/rollouts", json=rollout_body("e-1"))
        page = c.get("/rollouts/e-1/events").json()
        with c.stream("GET", "/rollouts/e-1/stream", headers={"Last-Event-ID": "1"}) as sse:
            text = "".join(sse.iter_text())
    first, last = page["events"]
    assert set(first) >= {"schema", "kind", "ts", "control", "payload", "digest", "sequence",
                          "event_id", "rollout_id"}
    assert (first["schema"], first["control"], first["sequence"], first["event_id"]) == (
        "synth.trace-stream-event.v1", False, 1, 1)
    assert last["kind"] == "rollout.completed" and last["payload"] == {"http_status": 200}
    assert last["digest"] == digest("rollout.completed", 2, {"http_status": 200})
    assert page["cursor"] == {"kind": "sequence", "after": 0, "next": 2, "high_water": 2,
                              "closed": True, "has_more": False}
    assert text.startswith("id: 2\nevent: rollout.completed\n")  # after Last-Event-ID


def test_the_envelope_digest_is_the_contracts_byte_exact_one():
    # Pinned from synth-containers 0.4.6's `envelope_digest` on the same input: a change
    # to the encoding (tags, key order, float bits, UTF-8 lengths) breaks its clients.
    payload = {"http_status": 200, "ratio": 0.5, "name": "é", "flags": [True, False, None],
               "nested": {"b": 1, "a": -3}}
    assert digest("rollout.completed", 2, payload) == "cf84aa64a695407b"


def test_prepare_gives_an_id_and_a_stream_before_the_rollout(serve, api_key):
    app = serve(create_app(toy_config(), api_keys=[api_key]))
    telemetry = {"enabled": True, "transport": "sse"}
    with client(app, api_key) as c:
        bare = c.post("/rollouts/prepare", json={"seed": 1})
        ws = c.post("/rollouts/prepare", json={"telemetry": {**telemetry,
                                                             "transport": "websocket"}})
        prepared = c.post("/rollouts/prepare", json={"rollout_id": "pr-1", "seed": 3,
                                                     "telemetry": telemetry}).json()
        again = c.post("/rollouts/prepare", json={"rollout_id": "pr-1", "seed": 3,
                                                  "telemetry": telemetry}).json()
        other = c.post("/rollouts/prepare", json={"rollout_id": "pr-1", "seed": 4,
                                                  "telemetry": telemetry})
        waiting = c.get("/rollouts/pr-1").json()
        ran = c.post("/rollouts", json=rollout_body("pr-1", telemetry=telemetry)).json()
    assert (bare.status_code, bare.json()) == (400, {"detail": "prepare_requires_telemetry"})
    assert ws.status_code == 422
    assert ws.json()["detail"]["error"]["errors"][0]["path"] == "telemetry.transport"
    assert prepared["rollout_id"] == "pr-1" and prepared["task_instance_id"] == "seed:3"
    assert prepared["stream"]["transports"]["sse"] == {"url": "/rollouts/pr-1/stream"}
    assert again["replayed"] is True
    assert other.status_code == 409
    assert other.json()["detail"]["error"] == "rollout_prepare_identity_conflict"
    assert (waiting["status"], waiting["started"]) == ("prepared", False)
    assert ran["status"] == "completed" and ran["stream"]["id"] == "stream:pr-1"


def test_a_prepared_rollouts_stream_opened_first_carries_its_events(serve, api_key):
    app = serve(create_app(toy_config(), api_keys=[api_key]))
    telemetry = {"enabled": True, "transport": "sse"}
    with client(app, api_key) as c, \
            client(app, api_key) as reader:
        c.post("/rollouts/prepare", json={"rollout_id": "ps-1", "telemetry": telemetry})
        with reader.stream("GET", "/rollouts/ps-1/stream") as sse:
            lines = sse.iter_lines()
            assert next(lines) == ": heartbeat"  # subscribed before the rollout starts
            c.post("/rollouts", json=rollout_body("ps-1", telemetry=telemetry))
            text = "\n".join(lines)
    assert "event: rollout.accepted" in text and "event: rollout.completed" in text


def test_a_submission_reads_the_contracts_fields(serve, api_key):
    app = serve(create_app(toy_config(), api_keys=[api_key]))
    with client(app, api_key) as c:
        by_instance = c.post("/rollouts", json={
            "rollout_id": "i-1", "task_instance_id": "seed:12", "trace_correlation_id": "c-1",
            "policy": {"model": "m"}}).json()
        url_cid = c.post("/rollouts", json={
            "rollout_id": "i-2", "seed": 1, "trace_correlation_id": "c-2", "policy": {
                "inference_url": "http://127.0.0.1:9/v1/chat/completions?cid=from-url"}}).json()
    assert by_instance["reward_info"]["outcome_reward"] == 1.2  # seed 12's reward
    assert by_instance["trace_correlation_id"] == "c-1"
    assert url_cid["trace_correlation_id"] == "from-url"  # the policy URL's id stands
