"""Rollouts, bad input and faults against a real uvicorn server."""

from __future__ import annotations

import asyncio
import gc
import logging
import time

import httpx
import pytest
from toy_apps import raising_rollout, slow_async_rollout, slow_sync_rollout, toy_config

from synth_deploy.serving import create_app
from synth_deploy.tracing import open_trace_store


@pytest.fixture
def toy(serve, api_key):
    return serve(create_app(toy_config(), api_keys=[api_key]))


def post(server, api_key, body, **kwargs):
    kwargs.setdefault("timeout", 10)
    if isinstance(body, (bytes, str)):
        return httpx.post(server.url + "/rollout", content=body, headers={
            "X-API-Key": api_key, "Content-Type": "application/json"}, **kwargs)
    return httpx.post(server.url + "/rollout", json=body, headers={"X-API-Key": api_key},
                      **kwargs)


def test_rollout_answers_both_reward_spellings(toy, api_key):
    resp = post(toy, api_key, {"run_id": "r-7", "env": {"seed": 7}})
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "application/json"
    assert int(resp.headers["content-length"]) == len(resp.content)
    body = resp.json()
    assert body["run_id"] == "r-7"
    m = body["metrics"]
    assert m["episode_rewards"] == m["episode_returns"] == [0.7]
    assert m["reward_mean"] == m["mean_return"] == 0.7
    assert body["aborted"] is False and body["branches"] == {}


def test_unknown_fields_from_older_clients_are_accepted(toy, api_key):
    body = {"run_id": "old", "env": {"seed": 1, "env_name": "x", "extra": 1}, "ops": ["agent"],
            "safety": {"max_ops": 10}, "policy": {"policy_name": "p", "config": {}, "new": 1}}
    assert post(toy, api_key, body).status_code == 200


def test_return_trace_gives_the_v3_session(toy, api_key):
    resp = post(toy, api_key, {"run_id": "t", "env": {"seed": 2}, "record": {"return_trace": 1}})
    trace = resp.json()["trace"]
    assert trace["metadata"]["run_id"] == "t"
    assert trace["outcome_rewards"][0]["total_reward"] == 0.2
    assert {"session_id", "session_time_steps", "event_history",
            "markov_blanket_message_history"} <= trace.keys()


BAD_REQUESTS = [
    # (body, expected code, a path the error must name)
    (b"{not json", "invalid_json", None),
    (b"", "invalid_json", None),
    (b"[1, 2]", "invalid_request", "(body)"),
    ({"env": {"seed": 1}}, "invalid_request", "run_id"),
    ({"run_id": ""}, "invalid_request", "run_id"),
    ({"run_id": 5}, "invalid_request", "run_id"),
    ({"run_id": "x", "env": {"seed": "abc"}}, "invalid_request", "env.seed"),
    ({"run_id": "x", "env": []}, "invalid_request", "env"),
    ({"run_id": "x", "policy": {"output_mode": "telepathy"}}, "invalid_request",
     "policy.output_mode"),
    ({"run_id": "x", "safety": {"max_time_s": -1}}, "invalid_request", "safety.max_time_s"),
    ({"run_id": "x", "mode": "train"}, "invalid_request", "mode"),
    ({"run_id": "x", "record": {"trace_format": "xml"}}, "invalid_request",
     "record.trace_format"),
]


@pytest.mark.parametrize(("body", "code", "path"), BAD_REQUESTS)
def test_malformed_requests_are_422_with_field_paths(toy, api_key, body, code, path):
    resp = post(toy, api_key, body)
    assert resp.status_code == 422
    error = resp.json()["detail"]["error"]
    assert error["code"] == code
    if path is not None:
        assert path in [e["path"] for e in error["errors"]]
        assert path in error["message"]


def test_body_over_the_limit_is_413_declared_or_streamed(serve, api_key):
    server = serve(create_app(toy_config(max_body_bytes=1024), api_keys=[api_key]))
    big = {"run_id": "big", "env": {"config": {"blob": "x" * 5000}}}
    assert post(server, api_key, big).status_code == 413

    def chunks():  # no Content-Length: the limit must hold while streaming too
        yield b'{"run_id": "big", "pad": "'
        for _ in range(10):
            yield b"x" * 500
        yield b'"}'

    resp = httpx.post(server.url + "/rollout", content=chunks(), headers={"X-API-Key": api_key})
    assert resp.status_code == 413
    assert post(server, api_key, {"run_id": "small"}).status_code == 200


def test_a_raising_rollout_is_500_naming_the_run_and_the_server_keeps_serving(serve, api_key):
    server = serve(create_app(toy_config(raising_rollout), api_keys=[api_key]))
    resp = post(server, api_key, {"run_id": "boom-1", "env": {"seed": 4}})
    assert resp.status_code == 500
    error = resp.json()["detail"]["error"]
    assert error["code"] == "rollout_failed" and error["run_id"] == "boom-1"
    assert "boom-1" in error["message"] and "environment crashed on seed 4" in error["message"]
    assert error["exception"] == "RuntimeError"
    assert httpx.get(server.url + "/health", headers={"X-API-Key": api_key}).status_code == 200


def test_an_exception_message_holding_the_key_is_redacted(serve, api_key):
    async def leaky(request, ctx):
        raise ValueError(f"bad auth {api_key}")

    server = serve(create_app(toy_config(leaky), api_keys=[api_key]))
    resp = post(server, api_key, {"run_id": "leak"})
    assert resp.status_code == 500 and api_key not in resp.text


def test_a_failing_rollout_is_logged_once_with_its_traceback_and_no_key(serve, api_key, caplog):
    # A bug that fails every rollout: one traceback for the operator (its secrets redacted,
    # the server's key and the request's own policy key), not one per rollout.
    policy_key = "sk-policy-secret-0123456789"

    async def leaky(request, ctx):
        raise ValueError(f"seed {request.env.seed}: bad auth {api_key} / {policy_key}")

    server = serve(create_app(toy_config(leaky), api_keys=[api_key]))
    with caplog.at_level(logging.ERROR, logger="synth_deploy.taskapp"):
        for seed in range(5):
            resp = post(server, api_key, {"run_id": f"leak-{seed}", "env": {"seed": seed},
                                          "policy": {"config": {"api_key": policy_key}}})
            assert resp.status_code == 500
    failures = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert len(failures) == 1, failures
    assert "rollout leak-0 failed" in failures[0] and "Traceback" in failures[0]
    assert "ValueError: seed 0: bad auth" in failures[0] and "in leaky" in failures[0]
    assert api_key not in caplog.text and policy_key not in caplog.text  # tracebacks too


def test_a_failing_live_export_never_fails_a_rollout_and_is_logged_once(serve, api_key,
                                                                        caplog):
    def collector_down(session):
        raise ConnectionError(f"collector refused the key {api_key}")

    server = serve(create_app(toy_config(), api_keys=[api_key], on_session=collector_down))
    with caplog.at_level(logging.ERROR, logger="synth_deploy.taskapp"):
        for i in range(3):
            assert post(server, api_key, {"run_id": f"live-{i}"}).status_code == 200
    [logged] = [r.getMessage() for r in caplog.records]
    assert logged.startswith("live export of rollout live-0 failed\nTraceback")
    assert "collector refused the key ****" in logged and api_key not in caplog.text


@pytest.mark.parametrize("details", [{"grader": "exact"}, None, "absent"])
def test_the_kit_adds_its_ledger_to_whatever_details_the_rollout_gave(serve, api_key, details):
    async def rollout(request, ctx):
        metrics = {"episode_rewards": [1.0]}
        if details != "absent":
            metrics["details"] = details
        return {"run_id": request.run_id, "metrics": metrics}

    server = serve(create_app(toy_config(rollout), api_keys=[api_key]))
    got = post(server, api_key, {"run_id": "d"}).json()["metrics"]["details"]
    assert got.pop("ledger")["rollouts"] == 1
    # Compared with the rollout's own object: a ledger written into it would show here.
    assert got == (details if isinstance(details, dict) else {})


def test_malformed_rollout_result_is_500_with_field_paths(serve, api_key):
    async def bad(request, ctx):
        return {"run_id": request.run_id, "metrics": {"num_steps": "many"}}

    server = serve(create_app(toy_config(bad), api_keys=[api_key]))
    error = post(server, api_key, {"run_id": "bad"}).json()["detail"]["error"]
    assert error["code"] == "invalid_rollout_result"
    assert "metrics.num_steps" in [e["path"] for e in error["errors"]]


def test_a_reward_that_is_not_a_finite_number_fails_the_rollout_saying_where(serve, api_key,
                                                                           tmp_path):
    # JSON has no NaN: answered, a NaN reward would reach the trainer as null (no reward,
    # or 0), and the store refused it with a NOT NULL constraint. Refused where it is said.
    async def returned(request, ctx):
        return {"run_id": request.run_id, "metrics": {"episode_rewards": [1.0, float("inf")]}}

    async def recorded(request, ctx):
        ctx.tracer.record_outcome_reward(float("nan"))
        return {"run_id": request.run_id}

    with open_trace_store(str(tmp_path / "t.db")) as store:
        error = post(serve(create_app(toy_config(returned), api_keys=[api_key],
                                      trace_store=store)),
                     api_key, {"run_id": "inf"}).json()["detail"]["error"]
        assert error["code"] == "invalid_rollout_result"
        assert "metrics.episode_rewards.1: Input should be a finite number" in error["message"]
        assert {"metrics.episode_rewards.1", "metrics.reward_mean"} <= {
            e["path"] for e in error["errors"]}
        resp = post(serve(create_app(toy_config(recorded), api_keys=[api_key],
                                     trace_store=store)), api_key, {"run_id": "nan"})
        assert resp.status_code == 500, resp.text
        message = resp.json()["detail"]["error"]["message"]
        assert "the outcome reward must be a finite number, got nan" in message
        stored = {s.run_id: s.status for s in store.list_sessions()}
    # Each failure stored as its rollout's error, not lost to the store's constraint.
    assert stored == {"inf": "error", "nan": "error"}


@pytest.mark.parametrize("rollout", [slow_async_rollout, slow_sync_rollout])
def test_safety_max_time_is_enforced(serve, api_key, rollout):
    server = serve(create_app(toy_config(rollout), api_keys=[api_key]))
    started = time.perf_counter()
    resp = post(server, api_key, {"run_id": "slow", "env": {"config": {"sleep": 2}},
                                  "safety": {"max_time_s": 0.3}})
    elapsed = time.perf_counter() - started
    assert resp.status_code == 504
    error = resp.json()["detail"]["error"]
    assert error["code"] == "rollout_timeout" and error["run_id"] == "slow"
    assert elapsed < 2.0, f"client waited {elapsed:.2f}s for a 0.3s bound"
    ok = post(server, api_key, {"run_id": "fast", "env": {"config": {"sleep": 0}}})
    assert ok.status_code == 200


def test_each_rollout_times_out_at_its_own_bound_never_before(serve, api_key):
    # Rollouts with different bounds at once: each 504 comes at its own bound (a deadline may
    # fire a little late, never early), and one that finishes in time is untouched.
    server = serve(create_app(toy_config(slow_async_rollout), api_keys=[api_key]))
    bounds = {"b-0.2": 0.2, "b-0.6": 0.6, "fast": 5.0}

    async def timed(client, run_id):
        body = {"run_id": run_id, "env": {"config": {"sleep": 0.05 if run_id == "fast" else 3}},
                "safety": {"max_time_s": bounds[run_id]}}
        started = time.perf_counter()
        resp = await client.post(server.url + "/rollout", json=body)
        return run_id, resp.status_code, time.perf_counter() - started

    async def main():
        async with httpx.AsyncClient(timeout=10, headers={"X-API-Key": api_key}) as client:
            return await asyncio.gather(*(timed(client, r) for r in bounds))

    answers = {run_id: (status, took) for run_id, status, took in asyncio.run(main())}
    assert answers["fast"][0] == 200
    for run_id in ("b-0.2", "b-0.6"):
        status, took = answers[run_id]
        assert status == 504
        # late by scheduling at most (a missing deadline would answer 200 after the 3-s sleep)
        assert bounds[run_id] <= took < bounds[run_id] + 2.0, (run_id, took)


@pytest.mark.parametrize("rollout", [slow_async_rollout, slow_sync_rollout])
def test_concurrent_rollouts_overlap(serve, api_key, rollout):
    server = serve(create_app(toy_config(rollout), api_keys=[api_key]))
    n, sleep = 20, 0.3

    async def main():
        async with httpx.AsyncClient(timeout=30, headers={"X-API-Key": api_key}) as client:
            return await asyncio.gather(*(client.post(server.url + "/rollout", json={
                "run_id": f"c-{i}", "env": {"config": {"sleep": sleep}}}) for i in range(n)))

    started = time.perf_counter()
    responses = asyncio.run(main())
    elapsed = time.perf_counter() - started
    assert [r.status_code for r in responses] == [200] * n
    assert sorted(r.json()["run_id"] for r in responses) == sorted(f"c-{i}" for i in range(n))
    assert elapsed < n * sleep / 2, f"{n} rollouts of {sleep}s took {elapsed:.2f}s: serialised?"


def test_task_info_one_seed_many_seeds_and_bad_seeds(toy, api_key):
    def get(query):
        return httpx.get(toy.url + "/task_info" + query, headers={"X-API-Key": api_key})

    one = get("?seed=3")
    assert one.status_code == 200 and one.json()["task_metadata"]["seed"] == 3
    many = get("?seed=1&seed=2&seeds=5")
    assert [i["task_metadata"]["seed"] for i in many.json()] == [1, 2, 5]
    assert "taskset" in get("").json()
    bad = get("?seed=abc")
    assert bad.status_code == 422 and "abc" in bad.json()["detail"]["error"]["message"]
    unknown = get("?seed=-4")
    assert unknown.status_code == 404 and "negative" in unknown.json()["detail"]["error"][
        "message"]


def test_info_advertises_datasets_and_rubrics(math_server, api_key):
    info = httpx.get(math_server.url + "/info", headers={"X-API-Key": api_key}).json()
    assert info["service"]["task"]["id"] == "math"
    assert info["dataset"]["datasets"][0]["splits"] == ["train", "test"]
    assert info["dataset"]["datasets"][0]["default_seeds"]["test"][0] == 9000
    assert info["rubrics"]["outcome"]["criteria"][0]["id"] == "correct_answer"


def test_startup_and_shutdown_hooks_run_with_app_state(serve, api_key):
    calls = []
    config = toy_config(startup_hooks=[lambda state: calls.append(("up", state["n"]))],
                        shutdown_hooks=[lambda state: calls.append(("down", state["n"]))],
                        app_state={"n": 1})
    server = serve(create_app(config, api_keys=[api_key]))
    assert calls == [("up", 1)]
    server.stop()
    assert calls == [("up", 1), ("down", 1)]


def test_building_and_serving_an_app_leaves_the_garbage_collector_alone(serve, api_key,
                                                                          monkeypatch):
    # smoke, eval, deploy's validation, a notebook: none of them is a serving process. The
    # calls are watched, not the freeze count: in a process that froze before (another
    # test's), the count falls whenever a frozen object is freed.
    calls: list[str] = []
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(gc, "set_threshold", lambda *a: calls.append(f"set_threshold{a}"))
    server = serve(create_app(toy_config(), api_keys=[api_key]))
    assert httpx.get(server.url + "/health", headers={"X-API-Key": api_key}).status_code == 200
    assert calls == []


def test_a_serving_process_freezes_what_exists_and_opens_as_many_files_as_allowed():
    script = (
        "import gc, json, resource\n"
        "from synth_deploy.serving import prepare_serving_process\n"
        "kept = {'rows': [1]}\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit("
        "resource.RLIMIT_NOFILE)[1]))\n"
        "prepare_serving_process()\n"
        "gc.collect()\n"
        "print(json.dumps({'frozen': not any(o is kept for o in gc.get_objects()),"
        " 'thresholds': gc.get_threshold(), 'files': resource.getrlimit("
        "resource.RLIMIT_NOFILE)}))\n")
    import json
    import resource
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    seen = json.loads(out)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    young, _, full = seen["thresholds"]
    assert seen["frozen"] and young >= 7000 and full >= 100  # CPython's: 700 and 10
    assert seen["files"] == [hard, hard] or hard == resource.RLIM_INFINITY


def test_user_middleware_and_extra_routers_see_protocol_routes_behind_the_key(serve, api_key):
    """An app's own routes and middleware sit behind the key gate like the protocol's: a
    keyless request is answered 401 before either sees it."""
    from fastapi import APIRouter

    router = APIRouter()

    @router.get("/custom")
    async def custom() -> dict:
        return {"custom": True}

    app = create_app(toy_config(routers=[router]), api_keys=[api_key])
    seen = []

    @app.middleware("http")
    async def record(request, call_next):
        seen.append(request.url.path)
        return await call_next(request)

    server = serve(app)
    assert httpx.get(server.url + "/health", headers={"X-API-Key": api_key}).status_code == 200
    assert httpx.get(server.url + "/health").status_code == 401
    assert httpx.get(server.url + "/custom").status_code == 401
    assert httpx.get(server.url + "/custom", headers={"X-API-Key": api_key}).json() == {
        "custom": True}
    assert seen == ["/health", "/custom"]
