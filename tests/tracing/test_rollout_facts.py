"""What a stored session says of its rollout (`describe_session`), wherever it is worked out:
in the server, in the store's writer thread, or in its writer child."""

from __future__ import annotations

import asyncio
import copy
import json
import types

from trace_files import ready_writer_child

from synth_deploy.tracing import (
    RolloutFacts,
    SessionTracer,
    describe_session,
    open_trace_store,
)

KEY = "sk-live-0123456789abcdef"
REQUEST = {"run_id": "r1", "env": {"seed": 7, "config": {"split": "train"}},
           "policy": {"config": {"model": "m", "api_key": KEY,
                                 "inference_url": f"https://user:{KEY}@llm.example/v1"}}}
ANSWER = {"run_id": "r1", "metrics": {
    "episode_rewards": [1.0], "reward_mean": 1.0, "outcome_reward": 1.0, "event_rewards": None,
    "num_steps": 3, "details": {"note": "kept", "ledger": {"wall_s": 0.5}}}}


def facts(answer=ANSWER, error=None, run_id="r1") -> RolloutFacts:
    head = {"app_id": "math", "run_id": run_id, "mode": "rl", "seed": 7, "model": "m",
            "env_name": None, "trace_correlation_id": "cid-1"}
    return RolloutFacts(head, 0.12345678, json.dumps({**REQUEST, "run_id": run_id}).encode(),
                        None if answer is None else json.dumps(answer).encode(), error)


def recorded_session(**metadata):
    tracer = SessionTracer(metadata=metadata)
    tracer.start_timestep("turn-1", turn_number=1)
    tracer.record_message("user", "What is 1 + 1?")
    return tracer.finish()


def test_a_session_says_which_rollout_it_was_what_was_asked_and_what_it_scored():
    session = recorded_session(note="the app's", run_id="the app may not rename it")
    describe_session(session, facts())
    metadata = session.metadata
    # Which rollout first, then what the app noted (its keys win over the head), then the
    # kit's outcome keys.
    assert list(metadata)[:7] == ["app_id", "run_id", "mode", "seed", "model", "env_name",
                                  "trace_correlation_id"]
    assert metadata["note"] == "the app's"
    assert metadata["run_id"] == "the app may not rename it"
    assert metadata["duration_s"] == 0.123457
    assert metadata["status"] == "ok"
    # The request as sent, its keys masked wherever they are.
    request = metadata["request"]
    assert request["env"] == REQUEST["env"]
    assert KEY not in json.dumps(request)
    assert request["policy"]["config"]["api_key"].startswith("****")
    assert request["policy"]["config"]["inference_url"] == "https://****@llm.example/v1"
    # The metrics as answered: those set, without the kit's ledger.
    assert metadata["metrics"] == {"episode_rewards": [1.0], "reward_mean": 1.0,
                                   "outcome_reward": 1.0, "num_steps": 3,
                                   "details": {"note": "kept"}}


def test_details_that_held_only_the_ledger_are_left_out():
    session = recorded_session()
    describe_session(session, facts({"run_id": "r1", "metrics": {
        "episode_rewards": [0.0], "details": {"ledger": {"wall_s": 1.0}}}}))
    assert session.metadata["metrics"] == {"episode_rewards": [0.0]}


def test_a_failed_rollout_says_its_error_and_no_metrics():
    session = recorded_session()
    error = {"code": "rollout_failed", "message": "rollout r1 failed: ValueError: boom"}
    describe_session(session, facts(answer=None, error=error))
    assert session.metadata["status"] == "error"
    assert session.metadata["error"] == error
    assert "metrics" not in session.metadata


def test_the_writer_child_describes_a_session_as_the_server_would(tmp_path):
    # The served path: the session crosses to the writer child with its facts, and the
    # stored metadata is what describing it in process gives.
    ok, failed = recorded_session(note="n"), recorded_session()
    error = {"code": "rollout_failed", "message": "boom"}
    expected = []
    for session, its_facts in ((ok, facts(run_id="r-ok")),
                               (failed, facts(answer=None, error=error, run_id="r-failed"))):
        here = copy.deepcopy(session)
        describe_session(here, its_facts)
        expected.append(here.metadata)

    with open_trace_store(tmp_path / "t.db") as store:
        async def main():
            await ready_writer_child(store)  # so the writes go to the child, not the thread
            await asyncio.gather(store.write_session(ok, rollout=facts(run_id="r-ok")),
                                 store.write_session(failed, rollout=facts(
                                     answer=None, error=error, run_id="r-failed")))
        asyncio.run(main())
        stored = [store.get_session(s.session_id).metadata for s in (ok, failed)]
    assert stored == expected
    assert KEY not in json.dumps(stored)


def test_a_session_holding_an_object_of_the_apps_own_class_is_stored_beside_the_others(
        tmp_path):
    # A served app loaded from its file: its classes live in a module nothing else can
    # import (not the writer child, nor pickle). Such a session goes by the store's writer
    # thread (the object as its str(), as rows keep it), and the session sent with it in
    # the same frame is stored too, each answered at once.
    module = types.ModuleType("an_app_loaded_from_its_file")
    exec("class Handle:\n    def __str__(self):\n        return 'handle #1'\n",
         module.__dict__)
    plain, tagged, later = recorded_session(), recorded_session(), recorded_session()
    tagged.metadata["handle"] = module.Handle()

    with open_trace_store(tmp_path / "t.db") as store:
        async def main():
            child = await ready_writer_child(store)
            await asyncio.wait_for(asyncio.gather(
                store.write_session(plain, rollout=facts(run_id="r-plain")),
                store.write_session(tagged, rollout=facts(run_id="r-tagged"))), 5)
            await asyncio.wait_for(store.write_session(later, rollout=facts(run_id="r-3")), 5)
            return child.alive
        assert asyncio.run(main())
        stored = {s.run_id: store.get_session(s.session_id).metadata
                  for s in store.list_sessions(limit=None)}
    assert set(stored) == {"r-plain", "r-tagged", "r-3"}
    assert stored["r-tagged"]["handle"] == "handle #1"
    assert KEY not in json.dumps(stored)
