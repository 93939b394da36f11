"""Sessions for the tracing tests: one shaped like the math app's, and a check that two
traces are the same once stored."""

from __future__ import annotations

from synth_deploy.tracing import SessionLog, SessionTrace, SessionTracer


def make_session(i: int = 0, *, app: str = "math", reward: float = 1.0,
                 status: str = "ok", model: str = "mock-model") -> SessionTrace:
    tracer = SessionTracer(metadata={"app_id": app, "run_id": f"run-{i}", "seed": i,
                                     "model": model, "status": status})
    for turn in (1, 2):
        tracer.start_timestep(f"turn-{turn}", turn_number=turn, metadata={"k": turn})
        tracer.record_message("system", "You add numbers.")
        tracer.record_message("user", f"What is {i} + {turn}?")
        tracer.record_lm_call(model_name=model, provider="127.0.0.1", input_tokens=10 + i,
                              output_tokens=5, latency_ms=1.5, cost_usd=0.001,
                              call_records=[{"request": {"n": i}}])
        reply = tracer.record_message("assistant", f"Answer: {i + turn}")
        event = tracer.record_environment_event(reward=reward, terminated=turn == 2,
                                                truncated=False,
                                                state_after={"parsed": i + turn})
        tracer.record_event_reward(1.0, reward_type="answer_format", turn_number=turn,
                                   event_id=event.id, message_id=reply.id, key="fmt",
                                   annotation={"why": "tagged"})
    tracer.record_message("tool_result", {"structured": [1, 2]})
    tracer.record_outcome_reward(reward, achievements_count=1, metadata={"expected": i})
    return tracer.finish()


def assert_same(a, b, where="trace"):
    """Equal, except stored timestamps, which keep microseconds."""
    if isinstance(a, float) and isinstance(b, float):
        assert abs(a - b) < 2e-6, where
    elif isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def judged_session(policy: str, judge: str) -> object:
    """A rollout whose policy used ``policy``, and whose answer a judge model scored."""
    tracer = SessionTracer(metadata={"app_id": "math", "run_id": f"run-{policy}",
                                     "model": policy, "status": "ok"})
    tracer.start_timestep("turn-1", turn_number=1)
    tracer.record_message("user", "What is 2 + 2?")
    tracer.record_lm_call(model_name=policy, input_tokens=5, output_tokens=2)
    tracer.record_message("assistant", "4")
    tracer.record_lm_call(model_name=judge, input_tokens=9, output_tokens=1,
                          system_instance_id="judge")
    tracer.record_outcome_reward(1.0)
    return tracer.finish()


def log_record(session) -> bytes:
    """The bytes of ``session``'s record in a session log."""
    log = SessionLog()
    assert log.append(session)
    [record] = log.take()
    return record
