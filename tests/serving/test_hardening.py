"""A task app on a public URL against hostile input (issue 12), each case against a real
uvicorn server on 127.0.0.1: the policy call as an SSRF vector, wrong methods, client mistakes
told apart from app failures, /task_info's seeds, content types."""

from __future__ import annotations

import json
import logging
import threading
import time

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from toy_apps import proxy_config, raising_rollout, toy_config

from synth_deploy.serving import create_app
from synth_deploy.taskapp import BadRequest, TaskDataset, TaskDescriptor, TaskInfo, call_policy
from synth_deploy.taskapp.policy import is_link_local

METADATA_SECRET = "AKIA-internal-credential-7f3e"


@pytest.fixture
def internal(serve):
    """An internal "metadata service" on loopback: any path answers its credential, 200, and
    quotes the request's Authorization header back, as careless services do."""
    hits: list[str] = []

    async def metadata(request):
        hits.append(request.method)
        return PlainTextResponse(f'{{"AccessKeyId": "{METADATA_SECRET}", "seen": '
                                 f'"{request.headers.get("authorization")}"}}')

    server = serve(Starlette(routes=[Route("/{path:path}", metadata,
                                           methods=["GET", "POST"])]))
    server.hits = hits
    return server


@pytest.fixture
def policy_app(serve, api_key):
    """A toy app whose rollout makes one policy call (the math app's shape, minus the math)."""

    async def rollout(request, ctx):
        reply = await call_policy(ctx, [{"role": "user", "content": "hi"}])
        return {"metrics": {"episode_rewards": [float(bool(reply.content))]}}

    return serve(create_app(toy_config(rollout), api_keys=[api_key]))


def rollout(server, key, inference_url=None, **config):
    policy = {"model": "m", **config}
    if inference_url is not None:
        policy["inference_url"] = inference_url
    return httpx.post(server.url + "/rollout", headers={"X-API-Key": key}, timeout=20,
                      json={"run_id": "ssrf-1", "env": {"seed": 1}, "policy": {
                          "config": policy}})


def error_of(resp: httpx.Response) -> dict:
    return resp.json()["detail"]["error"]


# -- the policy call: bodies, link-local (redirects: tests/taskapp/test_outbound.py) --------

def test_an_upstream_body_reaches_the_log_not_the_client(policy_app, internal, api_key,
                                                         caplog):
    # Pointed straight at the internal endpoint: it answers 200 with something that is not a
    # chat completion. The client learns the status and the host; the operator gets the body,
    # truncated, with the request's own secrets masked.
    policy_key = "sk-policy-key-0123456789"
    with caplog.at_level(logging.WARNING, logger="synth_deploy.taskapp"):
        resp = rollout(policy_app, api_key, internal.url + "/latest/meta-data",
                       api_key=policy_key)
    assert internal.hits == ["POST"]
    assert resp.status_code == 502
    message = error_of(resp)["message"]
    assert f"127.0.0.1:{internal.port}" in message and "200" in message
    assert METADATA_SECRET not in resp.text and "AccessKeyId" not in resp.text
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert METADATA_SECRET in logged and "seen" in logged  # the body, for the operator
    assert policy_key not in logged and policy_key not in resp.text


def test_an_error_answer_is_named_by_status_and_host_only(serve, policy_app, api_key):
    async def chat(request):
        return PlainTextResponse("internal stack: db=postgres://admin:hunter2@10.0.0.5/prod",
                                 status_code=500)

    upstream = serve(Starlette(routes=[Route("/v1/chat/completions", chat,
                                             methods=["POST"])]))
    resp = rollout(policy_app, api_key, upstream.url + "/v1")
    assert resp.status_code == 502
    assert "hunter2" not in resp.text and "postgres" not in resp.text
    assert "answered HTTP 500" in error_of(resp)["message"]


MAX_ANSWER_BYTES = 16 * 2**20  # the cap the README's Security section states


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_an_answer_too_large_to_hold_is_not_read(serve, policy_app, api_key, declared):
    chunk = b" " * 2**20

    async def chunks():  # no length up front: refused once past the cap, while reading
        for _ in range(MAX_ANSWER_BYTES // len(chunk) + 64):
            yield chunk

    async def chat(request):
        if declared:  # says how big it is up front: refused before a byte of it is read
            return Response(b"", headers={"content-length": str(MAX_ANSWER_BYTES + 1)})
        return StreamingResponse(chunks(), media_type="application/json")

    upstream = serve(Starlette(routes=[Route("/v1/chat/completions", chat,
                                             methods=["POST"])]))
    resp = rollout(policy_app, api_key, upstream.url + "/v1")
    assert resp.status_code == 502, resp.text
    assert "answered more than 16 MiB" in error_of(resp)["message"]


def test_link_local_addresses_are_refused_before_any_connection(policy_app, api_key):
    started = time.monotonic()
    resp = rollout(policy_app, api_key, "http://169.254.0.1:9/v1")
    assert time.monotonic() - started < 5  # refused, not a connect timeout
    assert resp.status_code == 422, resp.text
    error = error_of(resp)
    assert error["code"] == "refused_inference_url"
    assert "169.254.0.1" in error["message"] and "allow_link_local" in error["hint"]
    assert error["errors"] == [{"path": "policy.config.inference_url",
                                "message": error["message"]}]


@pytest.mark.parametrize("address, refused", [
    ("169.254.169.254", True), ("169.254.0.1", True), ("fd00:ec2::254", True),
    ("fe80::1", True), ("fe80::1%eth0", True), ("::ffff:169.254.169.254", True),
    ("64:ff9b::a9fe:a9fe", True), ("2002:a9fe:a9fe::1", True),
    ("127.0.0.1", False), ("10.0.0.5", False), ("::1", False), ("93.184.216.34", False),
    ("fd00:ec2::253", False), ("not an address", False),
])
def test_what_counts_as_link_local(address, refused):
    assert is_link_local(address) is refused


# -- what the client sends the policy call, and what the policy answers (issue 38) ------------

def test_a_sampling_parameter_json_cannot_carry_is_the_clients_mistake(policy_app, mock_policy,
                                                                       api_key):
    # 1e400 is valid JSON syntax but no double: read as infinity, which JSON cannot send on.
    body = ('{"run_id": "f-1", "env": {"seed": 1}, "policy": {"config": {"model": "m", '
            f'"inference_url": "{mock_policy.url}/v1", "temperature": 1e400}}}}}}')
    resp = httpx.post(policy_app.url + "/rollout", content=body, timeout=20,
                      headers={"X-API-Key": api_key, "Content-Type": "application/json"})
    assert resp.status_code == 422, resp.text
    error = error_of(resp)
    assert error["code"] == "invalid_policy_config"
    assert error["errors"][0]["path"] == "policy.config.temperature"


@pytest.mark.parametrize("host", ["0251.0376.0251.0376", "\uff11\uff12\uff17.0.0.1"],
                         ids=["octal", "full-width"])
def test_an_inference_url_the_server_cannot_call_is_422(policy_app, api_key, host):
    resp = rollout(policy_app, api_key, f"http://{host}:9/v1")
    assert resp.status_code == 422, resp.text
    error = error_of(resp)
    assert error["code"] == "invalid_inference_url"
    assert error["errors"][0]["path"] == "policy.config.inference_url"


def completion_with(message: dict, model: object = "m") -> Starlette:
    """A "policy" answering 200 with ``message`` as its one choice, and ``model``."""

    async def chat(request):
        from starlette.responses import JSONResponse

        return JSONResponse({"id": "x", "model": model, "choices": [
            {"index": 0, "message": message, "finish_reason": "stop"}]})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


@pytest.mark.parametrize("message, model, what", [
    ({"role": "assistant", "content": {"text": "4"}}, "m", "content is an object"),
    ({"role": "assistant", "content": ["4"]}, "m", "content is an array"),
    ({"role": "assistant", "content": 4}, "m", "content is a number"),
    ({"role": "assistant", "content": "4", "tool_calls": {"id": 1}}, "m",
     "tool_calls is an object"),
    ({"role": "assistant", "content": "4"}, {"name": "m"}, "model is an object"),
], ids=["content-dict", "content-list", "content-int", "tool-calls-dict", "model-object"])
def test_a_reply_of_the_wrong_shape_is_the_policys_failure(tmp_path, serve, math_config,
                                                           api_key, message, model, what):
    from synth_deploy.tracing import open_trace_store

    upstream = serve(completion_with(message, model))
    with open_trace_store(str(tmp_path / "traces.db")) as store:
        app = serve(create_app(math_config, api_keys=[api_key], trace_store=store))
        resp = rollout(app, api_key, upstream.url + "/v1")
        assert resp.status_code == 502, resp.text
        error = error_of(resp)
        assert error["code"] == "policy_failed" and what in error["message"]
        assert str(tmp_path) not in resp.text
        assert [s.status for s in store.list_sessions(limit=None)] == ["error"]


@pytest.mark.parametrize("model", [{"name": "m"}, ["m"], 5])
def test_a_model_that_is_not_a_name_is_the_clients_mistake(tmp_path, serve, math_config,
                                                           mock_policy, api_key, model):
    from synth_deploy.tracing import open_trace_store

    with open_trace_store(str(tmp_path / "traces.db")) as store:
        app = serve(create_app(math_config, api_keys=[api_key], trace_store=store))
        resp = rollout(app, api_key, mock_policy.url + "/v1", model=model)
        assert resp.status_code == 422, resp.text
        assert error_of(resp)["errors"][0]["path"] == "policy.config.model"
        assert store.count_sessions() == 1  # the refusal is traced too


def test_whatever_json_a_client_sends_for_model_and_seed_is_stored(tmp_path, serve, api_key):
    # An app that never calls the policy takes any policy.config, and any seed when it
    # declares no datasets: its trace must still store, not fail the rollout with a 500.
    from synth_deploy.tracing import open_trace_store

    with open_trace_store(str(tmp_path / "traces.db")) as store:
        app = serve(create_app(toy_config(), api_keys=[api_key], trace_store=store))
        for run_id, seed, model in (("t-1", 2**64, {"name": "m"}), ("t-2", -2**63 - 1, [1])):
            resp = httpx.post(app.url + "/rollout", headers={"X-API-Key": api_key}, timeout=10,
                              json={"run_id": run_id, "env": {"seed": seed},
                                    "policy": {"config": {"model": model}}})
            assert resp.status_code == 200, resp.text
        assert store.count_sessions() == 2


# -- methods ------------------------------------------------------------------------------------

@pytest.fixture
def uvicorn_errors(caplog):
    """What uvicorn logs at ERROR (an unhandled exception's traceback lands there)."""
    log = logging.getLogger("uvicorn.error")
    log.addHandler(caplog.handler)
    yield caplog
    log.removeHandler(caplog.handler)


@pytest.mark.parametrize("method, path, allowed", [
    ("GET", "/rollout", {"POST"}),
    ("DELETE", "/health", {"GET", "HEAD"}),
    ("OPTIONS", "/", {"GET", "HEAD"}),
    ("OPTIONS", "/rollout", {"POST"}),
    ("PUT", "/task_info", {"GET", "HEAD"}),
    ("PATCH", "/info", {"GET", "HEAD"}),
    ("GET", "/done", {"POST"}),
])
def test_a_wrong_method_is_405_with_allow_and_no_traceback(math_server, api_key, method, path,
                                                           allowed, uvicorn_errors):
    # Keyless, the same request is a 401 (tests/serving/test_auth.py): no route is mapped.
    resp = httpx.request(method, math_server.url + path, headers={"X-API-Key": api_key},
                         timeout=5)
    assert resp.status_code == 405, resp.text
    assert set(resp.headers["allow"].split(", ")) == allowed
    assert error_of(resp)["code"] == "method_not_allowed"
    assert "Traceback" not in resp.text
    assert [r for r in uvicorn_errors.records if r.levelno >= logging.ERROR] == []


def test_an_apps_own_router_answers_a_wrong_method_the_same_way(serve, api_key,
                                                                 uvicorn_errors):
    from fastapi import APIRouter

    router = APIRouter()

    @router.get("/leaderboard")
    async def leaderboard() -> dict:
        return {"top": []}

    app = serve(create_app(toy_config(routers=[router]), api_keys=[api_key]))
    keyed = {"X-API-Key": api_key}
    resp = httpx.delete(app.url + "/leaderboard", headers=keyed, timeout=5)
    assert resp.status_code == 405 and resp.headers["allow"] == "GET"
    assert error_of(resp)["code"] == "method_not_allowed"
    assert httpx.get(app.url + "/leaderboard", headers=keyed, timeout=5).json() == {"top": []}
    assert [r for r in uvicorn_errors.records if r.levelno >= logging.ERROR] == []


# -- client mistakes are 4xx, app failures 500 --------------------------------------------------


def leaky_failure(api_key: str) -> RuntimeError:
    return RuntimeError(f"database refused the key {api_key}")


def test_a_failing_route_is_logged_once_redacted_not_by_the_server(serve, api_key,
                                                                    uvicorn_errors):
    # A bug behind /task_info, on every request: each answered 500, one traceback for the
    # operator with the key masked, and nothing raised on to uvicorn (which would log a raw
    # traceback per request).
    def instances(seeds):
        raise leaky_failure(api_key)

    app = serve(create_app(toy_config(provide_task_instances=instances), api_keys=[api_key]))
    with uvicorn_errors.at_level(logging.ERROR):
        for seed in range(3):
            resp = httpx.get(app.url + f"/task_info?seeds={seed}",
                             headers={"X-API-Key": api_key}, timeout=5)
            assert resp.status_code == 500 and error_of(resp)["code"] == "internal_error"
    logged = [r.getMessage() for r in uvicorn_errors.records]
    assert len(logged) == 1 and logged[0].startswith("GET /task_info failed\nTraceback"), logged
    assert "RuntimeError: database refused the key ****" in logged[0]
    assert api_key not in uvicorn_errors.text


def test_an_apps_own_failing_route_is_logged_the_same_way(serve, api_key, uvicorn_errors):
    from fastapi import APIRouter

    router = APIRouter()

    @router.get("/leaderboard")
    async def leaderboard() -> dict:
        raise leaky_failure(api_key)

    app = serve(create_app(toy_config(routers=[router]), api_keys=[api_key]))
    with uvicorn_errors.at_level(logging.ERROR):
        for _ in range(3):
            assert httpx.get(app.url + "/leaderboard", headers={"X-API-Key": api_key},
                             timeout=5).status_code == 500
    logged = [r.getMessage() for r in uvicorn_errors.records]
    assert len(logged) == 1 and logged[0].startswith("GET /leaderboard failed"), logged
    assert api_key not in uvicorn_errors.text

def test_the_math_app_answers_client_mistakes_with_4xx(math_server, mock_policy, api_key):
    url = mock_policy.url + "/v1"
    cases = [
        ({"seed": 3}, {}, 422, "missing_inference_url", "policy.config.inference_url"),
        ({"seed": 99999}, {"inference_url": url}, 422, "unknown_seed", "env.seed"),
        ({"seed": 3, "config": {"max_turns": "many"}}, {"inference_url": url}, 422,
         "bad_request", "env.config.max_turns"),
        ({"seed": 3}, {"inference_url": "ftp://x"}, 422, "invalid_inference_url",
         "policy.config.inference_url"),
        ({"seed": 3}, {"inference_url": 5}, 422, "invalid_inference_url",
         "policy.config.inference_url"),
    ]
    for env, policy, status, code, field in cases:
        resp = httpx.post(math_server.url + "/rollout", headers={"X-API-Key": api_key},
                          timeout=20, json={"run_id": "c-1", "env": env,
                                            "policy": {"config": {"model": "m", **policy}}})
        assert resp.status_code == status, (env, policy, resp.text)
        error = error_of(resp)
        assert (error["code"], error["errors"][0]["path"]) == (code, field), error
    ok = httpx.post(math_server.url + "/rollout", headers={"X-API-Key": api_key}, timeout=20,
                    json={"run_id": "c-2", "env": {"seed": 3},
                          "policy": {"config": {"model": "m", "inference_url": url}}})
    assert ok.status_code == 200, ok.text


def test_an_app_says_bad_request_and_a_real_failure_stays_500(serve, api_key):
    async def picky(request, ctx):
        if request.env.config.get("level") not in ("easy", "hard"):
            raise BadRequest("env.config.level must be easy or hard", status=400,
                             code="bad_level", field="env.config.level")
        return {"metrics": {"episode_rewards": [1.0]}}

    app = serve(create_app(toy_config(picky), api_keys=[api_key]))
    bad = httpx.post(app.url + "/rollout", headers={"X-API-Key": api_key}, timeout=10,
                     json={"run_id": "p-1", "env": {"config": {"level": "medium"}}})
    assert bad.status_code == 400
    assert error_of(bad)["code"] == "bad_level" and error_of(bad)["run_id"] == "p-1"
    broken = serve(create_app(toy_config(raising_rollout), api_keys=[api_key]))
    crash = httpx.post(broken.url + "/rollout", headers={"X-API-Key": api_key}, timeout=10,
                       json={"run_id": "p-2", "env": {"seed": 1}})
    assert crash.status_code == 500 and error_of(crash)["code"] == "rollout_failed"


def test_bad_request_only_takes_4xx_statuses():
    with pytest.raises(ValueError, match="4xx"):
        BadRequest("no", status=500)


def test_declared_dataset_seeds_are_checked_before_the_app_runs(serve, api_key):
    ran: list[int] = []

    async def rollout_fn(request, ctx):
        ran.append(request.env.seed)
        return {"metrics": {"episode_rewards": [1.0]}}

    config = toy_config(rollout_fn)
    config.dataset_registry.register(TaskDataset("d", seeds=range(0, 10)))
    app = serve(create_app(config, api_keys=[api_key]))
    headers = {"X-API-Key": api_key}
    for seed, status in ((9, 200), (10, 422), (-1, 422)):
        resp = httpx.post(app.url + "/rollout", headers=headers, timeout=10,
                          json={"run_id": f"s{seed}", "env": {"seed": seed}})
        assert resp.status_code == status, resp.text
    assert ran == [9]
    resp = httpx.get(app.url + "/task_info", params={"seed": 10}, headers=headers, timeout=5)
    assert resp.status_code == 404 and "d: seeds 0-9" in error_of(resp)["message"]


# -- /task_info seeds ---------------------------------------------------------------------------

@pytest.mark.parametrize("seed", ["²", "٣", "1e3", "0x10", "9" * 5000, "1.5", "--1", " ", "",
                                  " 1", "1,2"])
@pytest.mark.parametrize("name", ["seed", "seeds"])
def test_task_info_takes_ascii_integers_only(math_server, api_key, name, seed):
    # As the OpenAPI document says (issue 38): an empty or spaced value is not "no seeds".
    if name == "seeds" and seed == "1,2":
        seed = "1,,2"
    resp = httpx.get(math_server.url + "/task_info", params={name: seed},
                     headers={"X-API-Key": api_key}, timeout=5)
    assert resp.status_code == 422, resp.text
    error = error_of(resp)
    assert error["code"] == "invalid_seed" and len(resp.text) < 1000
    assert error["errors"][0]["path"] == f"query.{name}"


def test_task_info_without_seeds_is_the_taskset_and_with_them_instances(math_server, api_key):
    headers = {"X-API-Key": api_key}
    resp = httpx.get(math_server.url + "/task_info", headers=headers, timeout=5)
    assert resp.status_code == 200 and "taskset" in resp.json()
    resp = httpx.get(math_server.url + "/task_info?seed=1&seed=-0&seeds=2,3", headers=headers,
                     timeout=5)
    assert resp.status_code == 200, resp.text
    assert [i["task_metadata"]["seed"] for i in resp.json()] == [1, 0, 2, 3]


def test_task_info_caps_the_seeds_of_one_request(math_server, api_key):
    headers = {"X-API-Key": api_key}
    many = ",".join(str(s) for s in range(1001))
    resp = httpx.get(math_server.url + "/task_info", params={"seeds": many}, headers=headers,
                     timeout=10)
    assert resp.status_code == 422 and error_of(resp)["code"] == "too_many_seeds"
    ok = httpx.get(math_server.url + "/task_info",
                   params={"seeds": ",".join(str(s) for s in range(1000))}, headers=headers,
                   timeout=30)
    assert ok.status_code == 200 and len(ok.json()) == 1000


def test_a_slow_synchronous_instances_function_does_not_stall_the_server(serve, api_key):
    entered, release = threading.Event(), threading.Event()

    def slow_instances(seeds):
        entered.set()
        release.wait(10)  # held until the other request has been answered
        return [TaskInfo(task=TaskDescriptor(id="toy", name="Toy")) for _ in seeds]

    app = serve(create_app(toy_config(provide_task_instances=slow_instances),
                           api_keys=[api_key]))
    slow = threading.Thread(target=httpx.get, args=(app.url + "/task_info",), kwargs=dict(
        params={"seed": 1}, headers={"X-API-Key": api_key}, timeout=15))
    slow.start()
    assert entered.wait(10)  # the slow request is inside the instances function now
    try:
        started = time.monotonic()
        assert httpx.get(app.url + "/", timeout=10).status_code == 200
        waited = time.monotonic() - started
    finally:
        release.set()
        slow.join()
    assert waited < 0.8, f"/ waited {waited:.2f}s behind a synchronous instances call"


# -- content types ------------------------------------------------------------------------------

@pytest.mark.parametrize("content_type", ["text/plain", "multipart/form-data; boundary=x",
                                          "application/x-www-form-urlencoded"])
def test_a_body_that_is_not_json_is_415(math_server, api_key, content_type):
    body = b'{"run_id": "t-1", "env": {"seed": 1}, "policy": {"config": {}}}'
    resp = httpx.post(math_server.url + "/rollout", content=body, timeout=5, headers={
        "X-API-Key": api_key, "Content-Type": content_type})
    assert resp.status_code == 415, resp.text
    assert error_of(resp)["code"] == "unsupported_media_type"


def test_the_vendor_proxy_takes_json_only_too(serve, api_key):
    app = serve(create_app(proxy_config("http://127.0.0.1:9/v1"), api_keys=[api_key]))
    resp = httpx.post(app.url + "/proxy/v1/chat/completions", content=b"model=x", timeout=5,
                      headers={"X-API-Key": api_key,
                               "Content-Type": "application/x-www-form-urlencoded"})
    assert resp.status_code == 415 and error_of(resp)["code"] == "unsupported_media_type"


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8",
                                          "application/vnd.synth+json"])
def test_json_content_types_are_read(math_server, mock_policy, api_key, content_type):
    body = ('{"run_id": "t-2", "env": {"seed": 1}, "policy": {"config": '
            f'{{"model": "m", "inference_url": "{mock_policy.url}/v1"}}}}}}')
    resp = httpx.post(math_server.url + "/rollout", content=body, timeout=20, headers={
        "X-API-Key": api_key, "Content-Type": content_type})
    assert resp.status_code == 200, resp.text


# -- the schema ---------------------------------------------------------------------------------

def test_the_openapi_document_is_behind_the_key(math_server, api_key):
    assert httpx.get(math_server.url + "/openapi.json", timeout=5).status_code == 401
    doc = httpx.get(math_server.url + "/openapi.json", headers={"X-API-Key": api_key},
                    timeout=5).json()
    assert {"/", "/health", "/info", "/task_info", "/rollout", "/done"} <= set(doc["paths"])
    body = doc["paths"]["/rollout"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"] == {"$ref": "#/components/schemas/RolloutRequest"}
    assert api_key not in str(doc)


def test_the_schema_and_the_server_agree_on_a_rollout_without_an_inference_url(
        math_server, mock_policy, api_key):
    # The protocol has trainers send policy.config.inference_url; an app that calls the policy
    # refuses a request without it (422), so the schema must not call that request valid.
    import jsonschema_rs  # schemathesis's own validator

    doc = httpx.get(math_server.url + "/openapi.json", headers={"X-API-Key": api_key},
                    timeout=5).json()
    schema = {"$ref": "#/components/schemas/RolloutRequest", **doc}
    valid = jsonschema_rs.Draft202012Validator(schema).is_valid
    without = {"run_id": "w-1", "env": {"seed": 1}, "policy": {"config": {"model": "m"}}}
    with_url = {**without, "policy": {"config": {"model": "m",
                                                 "inference_url": mock_policy.url + "/v1"}}}
    for body, schema_valid, status in ((without, False, 422), (with_url, True, 200)):
        assert valid(body) is schema_valid, body
        resp = httpx.post(math_server.url + "/rollout", json=body, timeout=20,
                          headers={"X-API-Key": api_key})
        assert resp.status_code == status, resp.text
    assert error_of(httpx.post(math_server.url + "/rollout", json=without, timeout=20, headers={
        "X-API-Key": api_key}))["code"] == "missing_inference_url"


def test_a_policy_call_sends_utf8_json_the_trace_records_and_refuses_nan(tmp_path, serve,
                                                                         api_key):
    from synth_deploy.tracing import open_trace_store

    received: list[bytes] = []

    async def chat(request):
        from starlette.responses import JSONResponse

        received.append(await request.body())
        return JSONResponse({"id": "x", "model": "m", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}}]})

    upstream = serve(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])]))
    text = "héllo ☃, NaN and Infinity are words here"

    async def rollout_fn(request, ctx):
        params = {"top_p": float(request.env.config.get("top_p", 0.5))}
        await call_policy(ctx, [{"role": "user", "content": text}], **params)
        return {"metrics": {"episode_rewards": [1.0]}}

    with open_trace_store(str(tmp_path / "traces.db")) as store:
        app = serve(create_app(toy_config(rollout_fn), api_keys=[api_key], trace_store=store))
        sent = rollout(app, api_key, upstream.url + "/v1")
        assert sent.status_code == 200, sent.text
        [raw] = received
        assert text.encode() in raw, "not sent as UTF-8"
        assert b", " not in raw.replace(text.encode(), b""), "not compact"
        [summary] = store.list_sessions()
        [event] = store.get_session(summary.session_id).events
        assert event.call_records[0]["request"] == json.loads(raw)
        refused = httpx.post(app.url + "/rollout", headers={"X-API-Key": api_key}, timeout=20,
                             json={"run_id": "nan-1", "env": {"seed": 1, "config": {
                                 "top_p": "nan"}}, "policy": {"config": {
                                     "model": "m", "inference_url": upstream.url + "/v1"}}})
        assert refused.status_code == 500, refused.text
        assert "Out of range float" in error_of(refused)["message"]
        assert len(received) == 1, "a NaN was sent"


def test_an_answer_with_a_lone_surrogate_escape_is_read(serve, api_key):
    """Half an emoji, escaped: valid JSON the stdlib reads and pydantic-core refuses."""
    from starlette.responses import Response

    async def chat(request):
        return Response(b'{"id":"x","model":"m","choices":[{"index":0,"message":{"role":'
                        b'"assistant","content":"half \\ud83d"}}]}',
                        media_type="application/json")

    upstream = serve(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])]))
    got: list[str] = []

    async def rollout_fn(request, ctx):
        got.append((await call_policy(ctx, [{"role": "user", "content": "hi"}])).content)
        return {"metrics": {"episode_rewards": [1.0]}}

    app = serve(create_app(toy_config(rollout_fn), api_keys=[api_key]))
    resp = rollout(app, api_key, upstream.url + "/v1")
    assert resp.status_code == 200, resp.text
    assert got == ["half \ud83d"]
