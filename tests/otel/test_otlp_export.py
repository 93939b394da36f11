"""`traces export --format otlp`: stored rollouts sent to a real receiver (an MLflow server,
tests/otel/conftest.py) and read back through MLflow's own API: one trace per rollout, its
steps and LM calls as child spans with the GenAI attributes, nothing duplicated by a second
export, resumable, and the trace database left as it was."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest
from processes import refused_port, run_cli
from sessions import judged_session

from synth_deploy.env import Env
from synth_deploy.otel import (
    OtlpExportError,
    OtlpExportOptions,
    default_state_path,
    export_otlp,
    otlp_setting,
    trace_id_of,
)
from synth_deploy.runs import run_suite
from synth_deploy.tracing import (
    SessionFilter,
    SessionTracer,
    ledger_of,
    open_trace_store,
    parse_trace_db,
)

SEEDS = [0, 1, 2]


@pytest.fixture
def rollout_db(tmp_path) -> Path:
    """Three real math rollouts (mock policy) and one failed rollout, in a trace file.

    New sessions for each test: a trace id is its session's, and MLflow keeps a trace in the
    experiment that first received it, so a second experiment would not see it again."""
    path = tmp_path / "traces.db"
    report = run_suite("math", SEEDS, Env(), traces=parse_trace_db(str(path)))
    assert report.errors == 0
    tracer = SessionTracer(metadata={"app_id": "math", "run_id": "rl-9-failed", "seed": 9,
                                     "mode": "rl", "model": "m", "status": "error",
                                     "error": {"code": "rollout_failed",
                                               "message": "rollout rl-9-failed failed: boom"}})
    tracer.start_timestep("turn-1", turn_number=1)
    tracer.record_lm_call(model_name="m", usage={"prompt_tokens": 5, "completion_tokens": 2},
                          latency_ms=12.0)
    with open_trace_store(str(path)) as store:
        store.write_session_sync(tracer.finish())
    return path


def stored_sessions(path: Path) -> dict[str, object]:
    with open_trace_store(str(path), read_only=True) as store:
        return {s.session_id: store.get_session(s.session_id)
                for s in store.list_sessions(limit=None)}


def by_trace_id(traces) -> dict[str, object]:
    return {t.info.trace_id: t for t in traces}


def mlflow_id(session_id: str) -> str:
    return f"tr-{trace_id_of(session_id):032x}"


def export(path: Path, receiver, experiment: str, **options):
    setting = otlp_setting(receiver.url, receiver.headers(experiment),
                           capture_content=options.pop("capture_content", False))
    with open_trace_store(str(path), read_only=True) as store:
        return export_otlp(store, setting, OtlpExportOptions(**options))


@pytest.mark.slow
def test_each_rollout_is_a_trace_of_its_steps_and_lm_calls(rollout_db, mlflow_receiver):
    sessions = stored_sessions(rollout_db)
    experiment = mlflow_receiver.new_experiment()
    progress = []

    setting = otlp_setting(mlflow_receiver.url, mlflow_receiver.headers(experiment))
    with open_trace_store(str(rollout_db), read_only=True) as store:
        result = export_otlp(store, setting, on_progress=lambda *a: progress.append(a))

    expected_spans = {sid: 1 + len(s.timesteps) + sum(e.event_type == "cais" for e in s.events)
                      for sid, s in sessions.items()}
    assert (result.sent, result.spans, result.already_sent) == (
        4, sum(expected_spans.values()), 0)
    assert progress[0] == (0, 4, 0) and progress[-1] == (4, 4, result.spans)
    traces = by_trace_id(mlflow_receiver.traces(experiment, expect=4))
    assert set(traces) == {mlflow_id(sid) for sid in sessions}

    for sid, session in sessions.items():
        spans = traces[mlflow_id(sid)].data.spans
        assert len(spans) == expected_spans[sid]
        roots = [s for s in spans if s.parent_id is None]
        assert len(roots) == 1
        root = roots[0]
        steps = [s for s in spans if s.parent_id == root.span_id]
        chats = [s for s in spans if s.name.startswith("chat ")]
        assert len(steps) == len(session.timesteps)
        assert {c.parent_id for c in chats} <= {s.span_id for s in steps}
        meta = session.metadata
        attrs = root.attributes
        assert (attrs["synth.session_id"], attrs["synth.run_id"], attrs["synth.seed"],
                attrs["synth.mode"], attrs["synth.app_id"]) == (
            sid, meta["run_id"], meta["seed"], "rl", "math")
        ledger = ledger_of(session)
        assert (attrs["synth.tokens.input"], attrs["synth.tokens.output"]) == (
            ledger.input_tokens, ledger.output_tokens)
        lm_events = [e for e in session.events if e.event_type == "cais"]
        assert sorted((c.attributes["gen_ai.usage.input_tokens"],
                       c.attributes["gen_ai.usage.output_tokens"]) for c in chats) == sorted(
            (e.input_tokens, e.output_tokens) for e in lm_events)
        for chat in chats:
            assert chat.attributes["gen_ai.operation.name"] == "chat"
            assert chat.attributes["gen_ai.request.model"] == lm_events[0].model_name
            assert "gen_ai.input.messages" not in chat.attributes  # content is opt-in
        if meta.get("status") == "error":
            assert root.status.status_code.value == "ERROR"
            assert attrs["error.type"] == "rollout_failed"
            continue
        assert attrs["synth.reward"] == session.outcome_rewards[-1].total_reward
        assert attrs["synth.model"] == meta["model"]
        step_events = [e for s in steps for e in s.events]
        assert [e.attributes["synth.reward.value"] for e in step_events
                if e.name == "reward"] == [r.reward_value for r in session.event_rewards]
        assert any(e.name == "environment.step" and "synth.reward" in e.attributes
                   for e in step_events)


def test_exporting_again_duplicates_nothing(rollout_db, mlflow_receiver):
    experiment = mlflow_receiver.new_experiment()
    first = export(rollout_db, mlflow_receiver, experiment)
    before = {t.info.trace_id: len(t.data.spans)
              for t in mlflow_receiver.traces(experiment, expect=4)}

    again = export(rollout_db, mlflow_receiver, experiment)  # remembered: nothing to send
    resent = export(rollout_db, mlflow_receiver, experiment, resend=True)  # sent anyway

    assert (first.sent, again.sent, again.already_sent, resent.sent) == (4, 0, 4, 4)
    after = {t.info.trace_id: len(t.data.spans) for t in mlflow_receiver.traces(experiment)}
    assert after == before and len(after) == 4


def test_an_interrupted_export_resumes_where_it_stopped(rollout_db, mlflow_receiver):
    experiment = mlflow_receiver.new_experiment()  # a new destination: nothing sent there yet
    part = export(rollout_db, mlflow_receiver, experiment, limit=1)
    rest = export(rollout_db, mlflow_receiver, experiment)

    assert (part.sent, part.already_sent) == (1, 0)
    assert (rest.sent, rest.already_sent) == (3, 1)
    assert len(mlflow_receiver.traces(experiment, expect=4)) == 4


def test_message_content_goes_on_lm_spans_only_when_asked(rollout_db, mlflow_receiver):
    sessions = stored_sessions(rollout_db)
    experiment = mlflow_receiver.new_experiment()
    export(rollout_db, mlflow_receiver, experiment, capture_content=True)

    for trace in mlflow_receiver.traces(experiment, expect=4):
        session = next(s for sid, s in sessions.items() if mlflow_id(sid) == trace.info.trace_id)
        if session.metadata.get("status") == "error":
            continue
        chat = next(s for s in trace.data.spans if s.name.startswith("chat "))
        # Sent as JSON text (OTLP has no nested values); MLflow hands it back parsed.
        inputs, outputs = (value if isinstance(value, list) else json.loads(value) for value in (
            chat.attributes["gen_ai.input.messages"], chat.attributes["gen_ai.output.messages"]))
        user = next(m for m in session.messages if m.message_type == "user")
        assert {"type": "text", "content": user.content} in [
            part for m in inputs if m["role"] == "user" for part in m["parts"]]
        assert outputs[0]["role"] == "assistant" and outputs[0]["parts"][0]["type"] == "text"


def test_export_leaves_the_trace_database_as_it_was(rollout_db, mlflow_receiver):
    before = hashlib.sha256(rollout_db.read_bytes()).hexdigest()
    with open_trace_store(str(rollout_db), read_only=True) as store:
        state = default_state_path(store)
    export(rollout_db, mlflow_receiver, mlflow_receiver.new_experiment())

    assert hashlib.sha256(rollout_db.read_bytes()).hexdigest() == before
    assert state == rollout_db.with_name(rollout_db.name + ".otlp-sent") and state.exists()


def test_the_export_state_keeps_no_password_of_the_endpoint(rollout_db):
    class Taking:  # an exporter that takes every batch: only the state file is looked at
        def export(self, spans):
            from opentelemetry.sdk.trace.export import SpanExportResult

            return SpanExportResult.SUCCESS

        def shutdown(self):
            pass

    setting = otlp_setting("http://user:hunter2-pass@127.0.0.1:9/?api_key=hunter3-key")
    with open_trace_store(str(rollout_db), read_only=True) as store:
        result = export_otlp(store, setting, exporter=Taking())
    assert result.sent == 4
    state = Path(result.state).read_bytes()
    assert b"127.0.0.1:9" in state
    assert b"hunter2-pass" not in state and b"hunter3-key" not in state


def test_the_cli_exports_to_the_receiver(rollout_db, mlflow_receiver, tmp_path):
    experiment = mlflow_receiver.new_experiment()
    state = tmp_path / "sent.sqlite"
    done = run_cli(tmp_path, "traces", "export", "--format", "otlp", "--endpoint",
                   mlflow_receiver.url, "--headers", f"x-mlflow-experiment-id={experiment}",
                   "--trace-db", str(rollout_db), "--state", str(state), "--json")

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["sent"], result["matched"], result["state"]) == (4, 4, str(state))
    assert result["endpoint"] == mlflow_receiver.url + "/v1/traces"
    assert len(mlflow_receiver.traces(experiment, expect=4)) == 4

    human = run_cli(tmp_path, "traces", "export", "--format", "otlp", "--endpoint",
                    mlflow_receiver.url, "--headers", f"x-mlflow-experiment-id={experiment}",
                    "--trace-db", str(rollout_db), "--state", str(state))
    assert human.returncode == 0, human.stderr
    assert "sent 0 rollout(s)" in human.stdout and "4 sent before were skipped" in human.stdout

    filtered = run_cli(tmp_path, "traces", "export", "--format", "otlp", "--endpoint",
                       mlflow_receiver.url, "--app", "crafter", "--since", "1h",
                       "--trace-db", str(rollout_db), "--state", str(state), "--json")
    assert filtered.returncode == 0, filtered.stderr
    assert json.loads(filtered.stdout)["matched"] == 0


def test_a_receiver_that_is_down_fails_the_export_and_keeps_nothing(rollout_db, tmp_path):
    state = tmp_path / "sent.sqlite"
    with refused_port() as port, open_trace_store(str(rollout_db), read_only=True) as store, \
            pytest.raises(OtlpExportError) as failed:
        down = f"http://127.0.0.1:{port}"
        export_otlp(store, otlp_setting(down, timeout_s=1.0), OtlpExportOptions(state=state))

    assert down + "/v1/traces" in failed.value.message
    assert "again to resume" in failed.value.hint
    assert failed.value.exit_code == 3
    with sqlite3.connect(state) as db:
        assert db.execute("SELECT COUNT(*) FROM sent").fetchone()[0] == 0


def test_the_model_filter_sends_the_sessions_of_that_policy_model(tmp_path, mlflow_receiver):
    # The rule of every filter (tests/tracing/test_session_filters.py): a session is found
    # by its policy's model, not by the judge model its LM calls also used.
    path = tmp_path / "judged.db"
    with open_trace_store(str(path)) as store:
        store.write_session_sync(judged_session("policy-a", "judge-b"))
        store.write_session_sync(judged_session("judge-b", "judge-c"))
        [policy_b] = [s.session_id for s in store.list_sessions() if s.model == "judge-b"]
    experiment = mlflow_receiver.new_experiment()
    result = export(path, mlflow_receiver, experiment, where=SessionFilter(model="judge-b"))
    assert result.sent == 1
    assert list(by_trace_id(mlflow_receiver.traces(experiment, expect=1))) == \
        [mlflow_id(policy_b)]
