"""Schema-based fuzzing of the served math app (issue 12).

schemathesis reads the app's own ``/openapi.json`` and generates requests for every operation,
valid ones and invalid ones; each is sent with the right key, a wrong key and no key, and a
valid-key rollout is sent once more pointed at the mock policy, so whole episodes run on
fuzzed seeds, configs and run ids (recorded in a real SQLite trace store). No answer may be a
5xx or carry a byte of the key. Every method a path does not take must be a 405 whose
``Allow`` names the ones it does.

The example counts are small on purpose (the suite stays fast) and every operation gets them
in both modes; the examples are derandomized (the same ones each run: a finding reproduces).
Raise FUZZ_EXAMPLES to dig, and set FUZZ_RANDOM=1 to draw new ones.
"""

from __future__ import annotations

import copy
import os
import socket
import time

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.configuration import set_hypothesis_home_dir
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from synth_deploy.env import Env
from synth_deploy.serving import LocalRunner, ServerKeys, ServeSettings
from synth_deploy.tracing import parse_trace_db

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "10"))
DERANDOMIZE = os.environ.get("FUZZ_RANDOM") != "1"
# These take more examples than the rest.
HEAVY = {"POST /rollout": 2, "GET /task_info": 2, "GET /api/sessions": 2,
         "GET /api/compare": 2}
WRONG_KEY = "sk_env_wrong_" + "0" * 24
KEY_HEADERS = {"x-api-key", "x-api-keys", "authorization"}
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


@pytest.fixture(autouse=True)
def hypothesis_files_in_pytests_cache(request):
    # Hypothesis keeps what it learns under ./.hypothesis unless told otherwise: in pytest's
    # own cache instead, which keeps it from run to run (it is slow to learn afresh).
    set_hypothesis_home_dir(request.config.cache.mkdir("hypothesis"))
    yield
    set_hypothesis_home_dir(None)


@pytest.fixture
def served(tmp_path, api_key):
    traces = parse_trace_db(str(tmp_path / "fuzz.db"), source="test")
    settings_ = ServeSettings(app="math", env=Env(), keys=ServerKeys((api_key,), "test"),
                              traces=traces)
    with LocalRunner(settings_) as runner:
        yield runner


def stranger_addresses():
    """A loopback address for each refusal probe, a new one every 8: past 20 refusals a
    second an address waits a second for each (`FailedAuth`), a wait these probes are not
    about. Where only 127.0.0.1 is loopback (macOS), that one: slower, the same checks."""
    try:
        with socket.socket() as probe:
            probe.bind(("127.0.0.2", 0))
    except OSError:
        while True:
            yield "127.0.0.1"
    n = 0
    while True:
        yield f"127.0.0.{2 + n // 8 % 250}"
        n += 1


class FromAddress(requests.adapters.HTTPAdapter):
    """A requests adapter whose connections leave from ``address``."""

    def __init__(self, address: str) -> None:
        self.address = address
        super().__init__()

    def init_poolmanager(self, *args, **kwargs) -> None:
        super().init_poolmanager(*args, source_address=(self.address, 0), **kwargs)


def _findings(api_key: str, resp: httpx.Response | object, what: str) -> list[str]:
    status = resp.status_code
    raw = resp.content + "".join(f"{k}: {v}" for k, v in resp.headers.items()).encode()
    found = []
    if status >= 500:
        found.append(f"{what} -> {status} {resp.text[:200]}")
    if api_key.encode() in raw:
        found.append(f"{what} -> the key is in the answer")
    return found


def fuzz_every_operation(schema, each_case) -> None:
    """``each_case(case)`` for valid and invalid cases of every operation of ``schema``;
    fails unless every operation got a case."""
    operations, covered = [], set()
    for result in schema.get_all_operations():
        operation = result.ok()
        operations.append(operation.label)
        examples = EXAMPLES * HEAVY.get(operation.label, 1)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=examples, deadline=None, database=None,
                      derandomize=DERANDOMIZE, phases=[Phase.explicit, Phase.generate],
                      suppress_health_check=list(HealthCheck))
            def fuzz(case):
                covered.add(case.operation.label)
                each_case(case)

            try:
                fuzz()
            except Unsatisfiable:  # nothing to make invalid (GET / has no inputs)
                continue
    assert operations and covered == set(operations), set(operations) - covered


def _generated_url(body: object) -> bool:
    policy = body.get("policy") if isinstance(body, dict) else None
    config = policy.get("config") if isinstance(policy, dict) else None
    return isinstance(config, dict) and isinstance(config.get("inference_url"), str)


@pytest.mark.slow
def test_fuzzed_requests_get_no_server_error_and_no_key(served, mock_policy, api_key):
    schema = schemathesis.openapi.from_url(served.url + "/openapi.json",
                                           headers={"X-API-Key": api_key})
    findings: list[str] = []
    sent = 0
    started = time.monotonic()
    session = requests.Session()  # one keep-alive connection, not one per request

    addresses, strangers = stranger_addresses(), {}

    def stranger() -> requests.Session:
        address = next(addresses)
        if address not in strangers:
            strangers[address] = requests.Session()
            strangers[address].mount("http://", FromAddress(address))
        return strangers[address]

    def send(case, key: str | None, body_override=None) -> None:
        nonlocal sent
        headers = {k: v for k, v in (case.headers or {}).items()
                   if k.lower() not in KEY_HEADERS}
        if key is not None:
            headers["X-API-Key"] = key
        if body_override is None and _generated_url(case.body):
            # The schema has an inference_url in every valid rollout: never a generated host
            # (no network but loopback), whatever else was generated, and time for the
            # episode (a generated max_time_s of 1e-300 is a 504 the client asked for).
            body_override = copy.deepcopy(case.body)
            body_override["policy"]["config"]["inference_url"] = mock_policy.url + "/v1"
            body_override["safety"] = {"max_time_s": 60}
        kwargs = {"json": body_override} if body_override is not None else {}
        resp = case.call(base_url=served.url, session=session if key == api_key else stranger(),
                         headers=headers, timeout=30, **kwargs)
        sent += 1
        what = f"{case.method} {case.formatted_path} key={'valid' if key == api_key else key}"
        findings.extend(_findings(api_key, resp, what))

    refused: dict[str, int] = {}  # refusal probes sent, by operation

    def each_case(case) -> None:
        # Without the key (or with a wrong one), every request is answered by the key gate
        # before any route parses it: a couple of cases an operation show its answer leaks
        # nothing, where every case would repeat the same refusal.
        probes = refused[case.operation.label] = refused.get(case.operation.label, 0) + 1
        for key in (api_key, WRONG_KEY, None) if probes <= 2 else (api_key,):
            send(case, key)
        body = case.body if isinstance(case.body, dict) else None
        policy = body.get("policy") if body else None
        if isinstance(policy, dict) and isinstance(policy.get("config"), dict):
            # The whole episode, on whatever else was generated.
            episode = {**body, "policy": {**policy, "config": {
                **policy["config"], "model": "mock",
                "inference_url": mock_policy.url + "/v1"}},
                "safety": {"max_time_s": 60}}
            send(case, api_key, body_override=episode)

    with session:
        fuzz_every_operation(schema, each_case)
    for refusing in strangers.values():
        refusing.close()
    assert sent > 100, sent
    assert findings == [], "\n".join(findings[:20])
    print(f"fuzz: {sent} requests in {time.monotonic() - started:.1f}s, 0 findings")


@pytest.mark.slow
def test_every_method_a_path_does_not_take_is_405_with_allow_to_a_key_holder(served, api_key):
    doc = httpx.get(served.url + "/openapi.json", headers={"X-API-Key": api_key},
                    timeout=5).json()
    checked = 0
    client = httpx.Client(base_url=served.url, timeout=5)  # one client, kept-alive
    strangers: dict[str, httpx.Client] = {}
    addresses = stranger_addresses()
    for path, operations in doc["paths"].items():
        documented = {m.upper() for m in operations}
        if "GET" in documented:
            documented.add("HEAD")
        for method in METHODS:
            if method in documented:
                continue
            resp = client.request(method, path, headers={"X-API-Key": api_key})
            assert resp.status_code == 405, (method, path, resp.status_code, resp.text)
            assert set(resp.headers["allow"].split(", ")) == documented, (method, path)
            # Without the key no route is mapped, public or not: what a method does is
            # for key holders to learn.
            for headers, status in (({"X-API-Key": WRONG_KEY}, 403), ({}, 401)):
                address = next(addresses)
                if address not in strangers:
                    strangers[address] = httpx.Client(
                        base_url=served.url, timeout=5,
                        transport=httpx.HTTPTransport(local_address=address))
                refused = strangers[address].request(method, path, headers=headers)
                assert refused.status_code == status, (method, path, refused.text)
            checked += 1
    client.close()
    for stranger in strangers.values():
        stranger.close()
    assert checked > 50


@pytest.fixture
def viewer(tmp_path, serve):
    """The viewer over a store of known sessions (two apps, models, runs, splits)."""
    from known_traces import build_known_store

    from synth_deploy.tracing import open_trace_store
    from synth_deploy.viewer import create_viewer_app

    build_known_store(tmp_path / "known.db")
    with open_trace_store(str(tmp_path / "known.db"), read_only=True) as store:
        yield serve(create_viewer_app(store))


@pytest.mark.slow
def test_fuzzed_viewer_requests_get_no_server_error(viewer):
    # The viewer's own document: every filter, page and compare parameter, valid and not.
    schema = schemathesis.openapi.from_url(viewer.url + "/api/openapi.json")
    findings: list[str] = []
    sent = 0
    session = requests.Session()

    def each_case(case) -> None:
        nonlocal sent
        resp = case.call(base_url=viewer.url, session=session, timeout=30)
        sent += 1
        if resp.status_code >= 500:
            findings.append(f"{case.method} {case.formatted_path}?{case.query} -> "
                            f"{resp.status_code} {resp.text[:200]}")

    with session:
        fuzz_every_operation(schema, each_case)
    assert sent > 100, sent
    assert findings == [], "\n".join(findings[:20])
