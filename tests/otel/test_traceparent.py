"""W3C trace context: a rollout sent with a ``traceparent`` is stored with it, its policy
calls carry it on (the rollout's span as their parent), and its spans, exported from the
store or live, are in the caller's trace under the caller's span (a real receiver: MLflow,
tests/otel/conftest.py)."""

from __future__ import annotations

import secrets

import httpx
import pytest
from processes import free_port, run_cli

from synth_deploy.env import Env
from synth_deploy.otel import rollout_span_id, session_spans, session_trace_id
from synth_deploy.runs import PolicyTarget, create_mock_policy_app, rollout_request
from synth_deploy.serving import LocalRunner, ServerKeys, ServeSettings
from synth_deploy.tracing import SessionTracer, TraceParent, incoming_trace_context, parse_trace_db


def caller_context() -> tuple[str, str, str]:
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, parent_id, f"00-{trace_id}-{parent_id}-01"


@pytest.fixture
def recorded_policy(serve):
    """The kit's mock policy, with the ``traceparent`` of every call it gets noted."""
    seen: list[bytes | None] = []
    policy = create_mock_policy_app()

    async def noting(scope, receive, send):
        if scope["type"] == "http" and scope["path"].endswith("/chat/completions"):
            seen.append(dict(scope["headers"]).get(b"traceparent"))
        await policy(scope, receive, send)

    server = serve(noting)
    return server, seen


def serve_math(tmp_path, api_key: str, env: Env) -> LocalRunner:
    return LocalRunner(ServeSettings(app="math", env=env, keys=ServerKeys((api_key,), "test"),
                                     traces=parse_trace_db(str(tmp_path / "traces.db")),
                                     port=free_port(), log_level="warning"))


def roll(runner: LocalRunner, api_key: str, policy_url: str, seed: int, traceparent: str):
    resp = httpx.post(runner.url + "/rollout", timeout=60, json=rollout_request(
        seed, PolicyTarget(policy_url + "/v1", "mock")),
        headers={"X-API-Key": api_key, "traceparent": traceparent})
    assert resp.status_code == 200, resp.text


def spans_by_name(trace) -> dict[str, object]:
    return {s.name: s for s in trace.data.spans}


@pytest.mark.slow
def test_an_otlp_export_of_a_rollout_sent_with_a_traceparent_carries_its_trace_id(
        tmp_path, api_key, recorded_policy, mlflow_receiver):
    policy, seen = recorded_policy
    trace_id, parent_id, header = caller_context()
    with serve_math(tmp_path, api_key, Env()) as runner:
        roll(runner, api_key, policy.url, 3, header)
    from synth_deploy.tracing import open_trace_store

    with open_trace_store(str(tmp_path / "traces.db"), read_only=True) as store:
        [summary] = store.list_sessions(limit=None)
        session = store.get_session(summary.session_id)
    # Stored with the session; sent on with each policy call, from the rollout's span.
    assert session.metadata["traceparent"] == header
    ours = f"00-{trace_id}-{rollout_span_id(session.session_id):016x}-01".encode()
    assert seen and set(seen) == {ours}
    assert session_trace_id(session.session_id, session.metadata) == int(trace_id, 16)

    experiment = mlflow_receiver.new_experiment()
    sent = run_cli(tmp_path, "traces", "export", "--format", "otlp", "--trace-db",
                   str(tmp_path / "traces.db"), "--endpoint", mlflow_receiver.url,
                   "--headers", f"x-mlflow-experiment-id={experiment}", "--json")
    assert sent.returncode == 0, sent.stderr
    [trace] = mlflow_receiver.traces(experiment, expect=1)
    assert trace.info.trace_id == f"tr-{trace_id}"
    root = spans_by_name(trace)["rollout math"]
    assert root.parent_id == parent_id  # the caller's span
    assert all(s.trace_id == root.trace_id for s in trace.data.spans)

    # Served with the live export: the same, as each rollout finishes.
    live_trace, live_parent, live_header = caller_context()
    experiment = mlflow_receiver.new_experiment()
    env = Env({"OTEL_EXPORTER_OTLP_ENDPOINT": mlflow_receiver.url,
               "OTEL_EXPORTER_OTLP_HEADERS": f"x-mlflow-experiment-id={experiment}"})
    (tmp_path / "live").mkdir()
    with serve_math(tmp_path / "live", api_key, env) as runner:
        roll(runner, api_key, policy.url, 4, live_header)
        [trace] = mlflow_receiver.traces(experiment, expect=1)
    assert trace.info.trace_id == f"tr-{live_trace}"
    assert spans_by_name(trace)["rollout math"].parent_id == live_parent


def test_without_valid_trace_context_a_rollout_starts_its_own_trace():
    # Not trace context (W3C: ignored, never an error): a trace of the session's own.
    for header in (None, "", "garbage", "ff-" + "a" * 32 + "-" + "b" * 16 + "-01",
                   "00-" + "0" * 32 + "-" + "b" * 16 + "-01",
                   "00-" + "a" * 32 + "-" + "0" * 16 + "-01",
                   "00-" + "A" * 32 + "-" + "b" * 16 + "-01",
                   "00-" + "a" * 32 + "-" + "b" * 16 + "-01-extra"):
        assert TraceParent.parse(header) is None, header
        with incoming_trace_context(header):
            session = SessionTracer().finish()
        assert "traceparent" not in session.metadata
        [root, *_] = session_spans(session)
        assert root.parent is None
        assert root.context.trace_id == session_trace_id(session.session_id, {})
    # A later version may add fields: its first four are read.
    later = "01-" + "a" * 32 + "-" + "b" * 16 + "-00-more"
    assert TraceParent.parse(later) == TraceParent("a" * 32, "b" * 16, "00")
    with incoming_trace_context(later):
        session = SessionTracer().finish()
    [root, *_] = session_spans(session)
    assert root.context.trace_id == int("a" * 32, 16) and root.parent.span_id == int("b" * 16, 16)
    assert root.parent.is_remote
