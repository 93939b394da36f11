"""The live export: a served app with OTEL_EXPORTER_OTLP_ENDPOINT set sends each rollout as
spans as it finishes, from the background; a receiver that is down or silent never fails a
rollout, and what cannot be sent is dropped and counted."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import httpx
import pytest
from processes import clean_env, free_port, refused_port, wait_until_up

from synth_deploy.env import Env
from synth_deploy.otel import LiveExporter, OtlpSetting, trace_id_of
from synth_deploy.runs import PolicyTarget, RunOptions, rollout_request, run_rollouts, run_suite
from synth_deploy.serving import LocalRunner, ServeSettings, server_keys
from synth_deploy.tracing import SessionTracer, open_trace_store, parse_trace_db


def otel_env(endpoint: str, *headers: str, **more: str) -> Env:
    values = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, **more}
    if headers:
        values["OTEL_EXPORTER_OTLP_HEADERS"] = ",".join(headers)
    return Env(values)


@pytest.fixture
def silent_receiver() -> Iterator[str]:
    """A receiver that accepts connections and never answers (a hung collector)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(2)
    for conn in held:
        conn.close()
    server.close()


def test_a_served_app_sends_each_rollout_as_it_finishes(mlflow_receiver, tmp_path,
                                                        mock_policy, api_key):
    experiment = mlflow_receiver.new_experiment()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    db = tmp_path / "traces.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "synth_deploy.cli", "serve", "math", "--port", str(port),
         "--trace-db", str(db)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=clean_env(ENVIRONMENT_API_KEY=api_key,
                                 OTEL_EXPORTER_OTLP_ENDPOINT=mlflow_receiver.url,
                                 OTEL_EXPORTER_OTLP_HEADERS=f"x-mlflow-experiment-id={experiment}"))
    try:
        wait_until_up(url, proc, timeout_s=60)
        policy = PolicyTarget(mock_policy.url + "/v1", "mock")
        for seed in (0, 1):
            resp = httpx.post(url + "/rollout", headers={"X-API-Key": api_key}, timeout=60,
                              json=rollout_request(seed, policy))
            assert resp.status_code == 200, resp.text
        # The server is still running: the spans went out as the rollouts finished.
        traces = mlflow_receiver.traces(experiment, expect=2)
    finally:
        proc.terminate()
        proc.wait(30)
    with open_trace_store(str(db), read_only=True) as store:
        stored = {s.session_id for s in store.list_sessions(limit=None)}
    assert {t.info.trace_id for t in traces} == {f"tr-{trace_id_of(sid):032x}" for sid in stored}
    for trace in traces:
        assert any(s.attributes.get("gen_ai.operation.name") == "chat" for s in trace.data.spans)


def test_smoke_runs_send_their_rollouts_too_and_stop_after_the_last(mlflow_receiver, tmp_path):
    experiment = mlflow_receiver.new_experiment()
    env = otel_env(mlflow_receiver.url, f"x-mlflow-experiment-id={experiment}",
                   OTEL_SERVICE_NAME="math-under-test")
    report = run_suite("math", [0, 1, 2], env, traces=parse_trace_db(str(tmp_path / "t.db")))

    assert report.errors == 0
    # run_suite returned: the runner closed the exporter after sending what was queued.
    traces = mlflow_receiver.traces(experiment, expect=3)
    assert len(traces) == 3
    assert {t.info.tags.get("service.name") for t in traces} == {"math-under-test"}


@pytest.mark.slow
@pytest.mark.parametrize("receiver", ["refusing", "silent"])
def test_a_receiver_that_is_down_never_fails_a_rollout(receiver, silent_receiver, mock_policy):
    with refused_port() as port:
        endpoint = silent_receiver if receiver == "silent" else f"http://127.0.0.1:{port}"
        env = otel_env(endpoint, OTEL_EXPORTER_OTLP_TIMEOUT="2")
        runner = LocalRunner(ServeSettings(app="math", env=env,
                                           keys=server_keys(env, "ephemeral")))
        with runner:
            outcomes = asyncio.run(run_rollouts(
                runner.url, runner.settings.keys.primary, list(range(8)),
                PolicyTarget(mock_policy.url + "/v1", "mock"), RunOptions(concurrency=4)))
        stats = runner.live_export.stats()

    assert [o.ok for o in outcomes] == [True] * 8, [o.error for o in outcomes]
    assert stats.sent_sessions == 0
    assert stats.failed_sessions + stats.dropped_sessions == 8
    assert stats.queued == 0


def test_a_full_queue_drops_and_counts_without_blocking(silent_receiver):
    live = LiveExporter(OtlpSetting(endpoint=silent_receiver + "/v1/traces", timeout_s=5.0,
                                    queue_sessions=2))
    sessions = []
    for i in range(10):
        tracer = SessionTracer(metadata={"app_id": "toy", "seed": i})
        tracer.record_lm_call(model_name="m", input_tokens=3, output_tokens=1)
        sessions.append(tracer.finish())
    for session in sessions:
        live.offer(session)  # returns at once: the receiver holds the one batch in flight
    during = live.stats()
    final = live.close(timeout_s=1.0)

    # One session in flight, two queued, the rest dropped (and their 3 spans each counted).
    assert during.dropped_sessions >= 7
    assert during.dropped_spans == 3 * during.dropped_sessions
    assert final.sent_sessions == 0
    assert final.dropped_sessions + final.failed_sessions == 10


def test_without_the_otel_packages_the_app_serves_without_spans(tmp_path):
    script = (
        "import logging, sys\n"
        "sys.modules['opentelemetry.exporter.otlp.proto.http.trace_exporter'] = None\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "from synth_deploy.env import Env\n"
        "from synth_deploy.serving import LocalRunner, ServeSettings, server_keys\n"
        "env = Env({'OTEL_EXPORTER_OTLP_ENDPOINT': 'http://127.0.0.1:9'})\n"
        "runner = LocalRunner(ServeSettings(app='math', env=env, "
        "keys=server_keys(env, 'ephemeral')))\n"
        "runner.build()\n"
        "print('live export:', runner.live_export)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=clean_env(),
                          capture_output=True, text=True, timeout=120)

    assert done.returncode == 0, done.stderr
    assert "live export: None" in done.stdout
    assert "OTEL_EXPORTER_OTLP_ENDPOINT is set, but the OpenTelemetry packages are not " \
           "installed" in done.stderr
    assert "pip install 'synth-deploy[otel]'" in done.stderr


def test_a_sample_ratio_sends_the_same_share_of_rollouts_every_time(silent_receiver):
    sessions = [SessionTracer().finish() for _ in range(2000)]
    chosen = []
    for _ in range(2):
        live = LiveExporter(OtlpSetting(endpoint=silent_receiver + "/v1/traces",
                                        sample_ratio=0.25, queue_sessions=4000))
        for session in sessions:
            live.offer(session)
        stats = live.close(timeout_s=0.5)
        chosen.append(2000 - stats.sampled_out)
        assert stats.sent_sessions == 0  # the silent receiver takes nothing

    assert chosen[0] == chosen[1]  # decided by the trace id: the same rollouts each time
    assert 400 < chosen[0] < 600  # about a quarter of 2000
