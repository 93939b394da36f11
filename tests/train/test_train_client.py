"""JobClient and stream_job against the stand-in backend served on 127.0.0.1."""

from __future__ import annotations

import io
import json
import secrets
import time

import httpx
import pytest
from standins.health_servers import HeaderDripServer

from synth_deploy.errors import JobError, JobHTTPError, UsageError
from synth_deploy.train import (
    JobClient,
    JsonHandler,
    RetryPolicy,
    backend_url,
    masked,
    new_idempotency_key,
    sparkline,
    stream_job,
)

FAST = RetryPolicy(retries=3, backoff_s=0.01)
RL_BODY = {"job_type": "rl", "compute": {}, "data": {"endpoint_base_url": "http://x"}}


@pytest.fixture
def client(backend, synth_key):
    with JobClient(backend.url, synth_key, timeout_s=5.0, retry=FAST) as c:
        yield c


def test_502_after_recording_is_retried_with_the_same_key_and_makes_one_job(backend, client):
    backend.faults.fail_creates = 2
    retries = []
    client.on_retry = lambda n, why: retries.append(why)
    key = new_idempotency_key()
    reply = client.create_rl_job(RL_BODY, key)
    assert [why.split(";")[0] for why in retries] == ["HTTP 502", "HTTP 502"]
    assert all("; waiting " in why for why in retries)  # the screen says it waits, and how long
    assert backend.create_attempts[key] == 3
    assert [j.id for j in backend.jobs_for_key(key)] == [reply["job_id"]]
    assert len(backend.jobs) == 1


def test_create_that_stalls_past_the_timeout_is_retried_into_the_same_job(backend, synth_key):
    backend.faults.stall_creates, backend.faults.stall_s = 1, 1.0
    key = new_idempotency_key()
    with JobClient(backend.url, synth_key, timeout_s=0.3, retry=FAST) as c:
        reply = c.create_rl_job(RL_BODY, key)
    assert backend.create_attempts[key] == 2
    assert len(backend.jobs_for_key(key)) == 1 and len(backend.jobs) == 1
    assert reply["job_id"] == backend.jobs_for_key(key)[0].id


def test_persistent_5xx_raises_with_status_and_body(backend, client):
    backend.faults.fail_creates = 10
    with pytest.raises(JobHTTPError) as info:
        client.create_rl_job(RL_BODY, "k1")
    assert info.value.status == 502 and "bad gateway" in info.value.body
    assert info.value.payload == RL_BODY
    assert backend.create_attempts["k1"] == FAST.retries + 1
    assert len(backend.jobs) == 1  # recorded once, whatever the proxy said


def test_4xx_is_not_retried(backend, client):
    backend.faults.reject_payload = True
    with pytest.raises(JobHTTPError) as info:
        client.create_rl_job(RL_BODY, "k2")
    assert info.value.status == 422 and "batch_size" in info.value.body
    assert backend.create_attempts["k2"] == 1


def test_wrong_api_key_is_401_with_a_hint(backend):
    with JobClient(backend.url, "sk_wrong", retry=FAST) as c, pytest.raises(JobHTTPError) as info:
        c.get_job("rl", "job_0001")
    assert info.value.status == 401 and "dashboard" in info.value.hint


def test_unreachable_backend_is_a_job_error_after_bounded_retries():
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with JobClient(f"http://127.0.0.1:{port}", "k", timeout_s=1.0, retry=FAST) as c:
        with pytest.raises(JobError, match="failed after 4 attempts"):
            c.verify_task_app("http://127.0.0.1:1")


ONCE = RetryPolicy(retries=0)


def test_a_backend_dripping_its_answer_is_given_up_at_the_timeout(backend, synth_key):
    # Each byte comes well within the read timeout; the answer as a whole never does.
    backend.faults.drip, backend.faults.drip_s = "GET /api/rl/jobs/", 0.1
    started = time.monotonic()
    with JobClient(backend.url, synth_key, timeout_s=1.0, retry=ONCE) as c:
        with pytest.raises(JobError, match="failed after 1 attempts .*ReadTimeout"):
            c.get_job("rl", "job_0001")
    assert time.monotonic() - started < 3


def test_a_backend_dripping_its_headers_is_given_up_at_the_timeout():
    with HeaderDripServer() as server, JobClient(f"http://127.0.0.1:{server.port}", "k",
                                                 timeout_s=1.0, retry=ONCE) as c:
        started = time.monotonic()
        with pytest.raises(JobError, match="ReadTimeout"):
            c.get_job("rl", "job_0001")
        assert time.monotonic() - started < 3


@pytest.mark.parametrize("declared", [False, True], ids=["streamed", "content-length"])
def test_an_answer_too_large_is_not_read(backend, synth_key, declared):
    backend.faults.huge, backend.faults.huge_bytes = "GET /api/rl/jobs/", 64 * 2**20
    transport = None
    if declared:  # says its size up front: refused before a byte of the body is read
        transport = httpx.MockTransport(lambda request: httpx.Response(
            200, headers={"content-length": str(2**30)}, stream=httpx.ByteStream(b"{}")))
    with JobClient(backend.url, synth_key, timeout_s=10.0, retry=ONCE,
                   transport=transport) as c:
        with pytest.raises(JobError, match="answered more than 16 MiB"):
            c.get_job("rl", "job_0001")


def test_the_deadline_rides_on_httpx_s_own_pool():
    # install_deadlines wraps the network backend of httpx's pool: if httpx stops keeping it
    # in `_transport._pool._network_backend`, the headers' deadline is silently lost.
    with JobClient("http://127.0.0.1:9", "k") as c:
        backend = c._http._transport._pool._network_backend
        assert type(backend).__name__ == "_DeadlineBackend"


def test_upload_waits_until_ready_and_times_out_when_it_never_is(backend, client, tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "x"}]}\n')
    backend.faults.file_ready_after_s = 0.3
    file_id = client.upload_file(path)["id"]
    assert backend.files[file_id]["content"] == path.read_bytes()
    assert client.wait_file_ready(file_id, timeout_s=5, interval_s=0.05)["status"] == "ready"
    backend.faults.file_ready_after_s = 60
    slow = client.upload_file(path)["id"]
    with pytest.raises(JobError, match="not ready after"):
        client.wait_file_ready(slow, timeout_s=0.2, interval_s=0.05)
    backend.faults.file_ready_after_s, backend.faults.file_fails = 0, True
    bad = client.upload_file(path)["id"]
    with pytest.raises(JobError, match="rejected uploaded file"):
        client.wait_file_ready(bad, timeout_s=2, interval_s=0.05)


def test_stream_pages_events_without_gaps_or_repeats(backend, client):
    backend.faults.iterations = 450  # > two pages of 200
    job_id = client.create_rl_job(RL_BODY, "k3")["job_id"]
    out = io.StringIO()
    outcome = stream_job(client, "rl", job_id, JsonHandler(out), interval_s=0.01, timeout_s=10)
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    seqs = [x["seq"] for x in lines if x["record"] == "event"]
    assert seqs == list(range(1, 454))  # created, running, 450 steps, succeeded
    assert len([x for x in lines if x["record"] == "metric"]) == 450
    assert lines[-1] == {"record": "outcome", **outcome.to_dict()}
    assert outcome.status == "succeeded" and outcome.exit_code == 0
    assert outcome.job["model_id"] == f"ft:standin:{job_id}"


def test_stream_of_failing_job_and_of_slow_job(backend, client):
    backend.faults.job_fails = True
    job_id = client.create_rl_job(RL_BODY, "k4")["job_id"]
    failed = stream_job(client, "rl", job_id, JsonHandler(io.StringIO()), interval_s=0.01,
                        timeout_s=10)
    assert failed.status == "failed" and failed.exit_code == 1
    backend.faults.job_fails, backend.faults.event_step_s = False, 30.0
    slow_id = client.create_rl_job(RL_BODY, "k5")["job_id"]
    slow = stream_job(client, "rl", slow_id, JsonHandler(io.StringIO()), interval_s=0.05,
                      timeout_s=0.3)
    assert slow.timed_out and slow.exit_code == 4 and slow.status == "queued"


def test_backend_url_precedence():
    assert backend_url("http://flag/", "http://env") == "http://flag"
    assert backend_url(None, "http://env/api") == "http://env"
    assert backend_url(None, None) == "https://api.usesynth.ai"
    with pytest.raises(UsageError):
        backend_url("ftp://x", None)


def test_masked_hides_secret_names_and_values():
    secret = "sk_live_" + secrets.token_hex(8)
    out = masked({"api_key": secret, "nested": [{"TOKEN": "t0ken"}], "note": f"uses {secret}",
                  "n": 3}, [secret])
    text = json.dumps(out)
    assert secret not in text and "t0ken" not in text
    assert out["n"] == 3 and out["api_key"].startswith("**** (sha256:")


def test_client_repr_hides_the_key():
    c = JobClient("http://127.0.0.1:1", "sk_very_secret", transport=httpx.MockTransport(
        lambda r: httpx.Response(200)))
    assert "sk_very_secret" not in repr(c)
    c.close()


def test_sparkline_spans_low_to_high():
    assert sparkline([3.0, 2.0, 1.0]) == "█▅▁"[0] + sparkline([3.0, 2.0, 1.0])[1:]
    line = sparkline([float(i) for i in range(8)])
    assert line[0] == "▁" and line[-1] == "█" and len(line) == 8
    assert sparkline([]) == ""


class RunawayBackend:
    """A backend misbehaving on the events page, for httpx.MockTransport; time is fake and
    moves on with every request, so a loop that never checks it would trip ``max_requests``."""

    def __init__(self, page, *, max_requests: int = 2000) -> None:
        self.page = page  # since_seq -> the events answered
        self.now = 0.0
        self.requests = 0
        self.max_requests = max_requests

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        self.now += 0.01
        if self.requests > self.max_requests:
            raise RuntimeError(f"runaway: {self.requests} requests")
        if request.url.path.endswith("/events"):
            since = int(request.url.params.get("since_seq", 0))
            return httpx.Response(200, json={"events": self.page(since)})
        if request.url.path.endswith("/metrics"):
            return httpx.Response(200, json={"points": []})
        return httpx.Response(200, json={"job_id": "job_1", "status": "running"})

    def stream(self, handler, timeout_s: float = 0.05):
        with JobClient("http://backend.test", "k", retry=RetryPolicy(retries=0),
                       transport=httpx.MockTransport(self)) as c:
            return stream_job(c, "rl", "job_1", handler, interval_s=0.01, timeout_s=timeout_s,
                              clock=lambda: self.now, sleep=lambda s: setattr(
                                  self, "now", self.now + s))


def events_of(out: io.StringIO) -> list[dict]:
    return [r for r in map(json.loads, out.getvalue().splitlines()) if r["record"] == "event"]


@pytest.mark.parametrize("with_seq", [False, True])
def test_backend_ignoring_since_seq_ends_at_the_deadline_without_repeats(with_seq):
    page = [{"type": "rl.log", "message": f"line {i}", **({"seq": i + 1} if with_seq else {})}
            for i in range(200)]
    backend = RunawayBackend(lambda since: page)
    out = io.StringIO()
    outcome = backend.stream(JsonHandler(out))
    assert outcome.timed_out and outcome.exit_code == 4
    assert [e["message"] for e in events_of(out)] == [f"line {i}" for i in range(200)]
    assert backend.requests < 50


def test_endless_full_pages_still_stop_at_the_deadline():
    backend = RunawayBackend(lambda since: [{"seq": since + i, "type": "rl.log"}
                                            for i in range(1, 201)])
    outcome = backend.stream(JsonHandler(io.StringIO()), timeout_s=0.05)
    assert outcome.timed_out and backend.requests < 50


def test_backend_error_mid_stream_writes_no_outcome_record(backend, client):
    job_id = client.create_rl_job(RL_BODY, "k6")["job_id"]
    backend.faults.refuse_path_suffix = "/metrics"
    out = io.StringIO()
    with pytest.raises(JobHTTPError):
        stream_job(client, "rl", job_id, JsonHandler(out), interval_s=0.01, timeout_s=10)
    records = [json.loads(x)["record"] for x in out.getvalue().splitlines()]
    assert "event" in records and "outcome" not in records


def test_cli_handler_prints_event_text_verbatim():
    from rich.console import Console

    from synth_deploy.train import CliHandler

    console = Console(file=io.StringIO(), width=200, color_system=None)
    handler = CliHandler(console)
    message = "<s>[INST] sort arr[i] [/INST] [bold]done[/bold] [/]"
    handler.on_event({"seq": 7, "type": "rl.[x]", "message": message})
    handler.on_status("[red]odd[/red]", {})
    text = console.file.getvalue()
    assert f"   7 rl.[x] {message}" in text and "status: [red]odd[/red]" in text
