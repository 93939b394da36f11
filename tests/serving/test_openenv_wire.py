"""An app that declares an environment: the episode loop the kit derives for /rollout, and
OpenEnv's wire under /openenv (real uvicorn, a faithful OpenEnv client stand-in, a real trace
database): sessions over a WebSocket and over HTTP, the key rule, the lease, capacity, and a
trace per episode. OpenEnv's own client and validator: bench/openenv_wire.py."""

from __future__ import annotations

import itertools
import logging
import threading
import time

import httpx
import pytest
from standins.openenv_client import HTTPEnvClient, Rejected, ServerError, WSEnvClient
from toy_apps import CountEnv, env_config, toy_config

from synth_deploy.serving import RolloutLimits, create_app
from synth_deploy.taskapp import Outcome, Reward
from synth_deploy.tracing import open_trace_store


@pytest.fixture
def store(tmp_path):
    with open_trace_store(str(tmp_path / "traces.db")) as store:
        yield store


def wait_for(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def sessions_of(server, api_key) -> dict:
    return httpx.get(server.url + "/openenv/health", timeout=5).json()["capacity"]


def test_the_kit_derives_the_rollout_from_the_environment(serve, mock_policy, api_key):
    server = serve(create_app(env_config(), api_keys=[api_key]))
    resp = httpx.post(server.url + "/rollout", headers={"X-API-Key": api_key}, timeout=30,
                      json={"run_id": "r1", "env": {"seed": 2},
                            "policy": {"config": {"model": "mock",
                                                  "inference_url": mock_policy.url + "/v1"}},
                            "record": {"return_trace": True}})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    [trajectory] = body["trajectories"]
    steps = trajectory["steps"]
    assert steps and steps[-1]["done"] and not any(s["done"] for s in steps[:-1])
    assert all(s["tool_calls"][0]["function"]["name"] == "add" for s in steps)
    target = 3 + 2 % 5
    added = [s["info"]["added"] for s in steps]
    assert sum(added) >= target and sum(added[:-1]) < target
    landed = float(sum(added) == target)
    metrics = body["metrics"]
    assert metrics["outcome_reward"] == landed and metrics["num_steps"] == len(steps)
    assert trajectory["final"] == {"reward": landed}
    assert body["pipeline_metadata"]["tool"] == "add"
    # Each step: the environment's event (reward, state) and its named rewards, per turn.
    trace = body["trace"]
    envs = [e for e in trace["event_history"] if e["event_type"] == "environment"]
    assert [e["system_state_after"]["total"] for e in envs] == [
        sum(added[:i + 1]) for i in range(len(added))]
    assert [r["reward_type"] for r in trace["event_rewards"]] == ["progress"] * len(steps)
    first_prompt = trace["session_time_steps"][0]["markov_blanket_messages"]
    assert [m["message_type"] for m in first_prompt][:2] == ["system", "user"]
    assert first_prompt[1]["content"] == f"Reach {target} exactly; the total is 0."


def test_an_environment_failing_in_a_step_is_an_execution_error_logged_once(serve, api_key,
                                                                              caplog):
    # A bug in the environment's step: the session hears EXECUTION_ERROR and lives on; the
    # operator gets one traceback (the key it quoted masked), not one per step.
    class BrokenEnv(CountEnv):
        def step(self, action):
            raise RuntimeError(f"the scorer refused key {api_key}")

    server = serve(create_app(env_config(BrokenEnv), api_keys=[api_key]))
    with caplog.at_level(logging.ERROR, logger="synth_deploy.taskapp"), \
            WSEnvClient(server.url + "/openenv", headers={"X-API-Key": api_key}) as env:
        env.reset(seed=1)
        for _ in range(3):
            with pytest.raises(ServerError) as failed:
                env.step({"n": 1})
            assert failed.value.code == "EXECUTION_ERROR"
        assert env.reset(seed=2)["done"] is False  # the session still answers
    [logged] = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert "step failed\nTraceback" in logged and "the scorer refused key ****" in logged
    assert api_key not in caplog.text


def test_episodes_whose_traces_cannot_be_stored_are_logged_once(serve, api_key, caplog):
    from synth_deploy.errors import TraceStoreError

    class FullDisk:  # what the kit's store raises when its disk is full
        def start(self):
            pass

        async def write_session(self, session, rollout=None):
            raise TraceStoreError("trace database: cannot write: database or disk is full")

    server = serve(create_app(env_config(), api_keys=[api_key], trace_store=FullDisk()))
    with caplog.at_level(logging.ERROR, logger="synth_deploy.taskapp"), \
            WSEnvClient(server.url + "/openenv", headers={"X-API-Key": api_key}) as env:
        for _ in range(4):
            env.reset(seed=0)  # a target of 3: one step of 3 ends the episode
            with pytest.raises(ServerError) as failed:
                env.step({"n": 3})
            assert failed.value.code == "EXECUTION_ERROR"
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 1 and logged[0].startswith("trace write failed for episode"), logged


class LabeledCountEnv(CountEnv):
    """A CountEnv whose traced steps carry what its reset chose (a seed when none was asked)."""

    def reset(self, seed, *, episode_id, config):
        self.timestep_metadata = {"seed": seed if seed is not None else 4, "label": "chosen"}
        return super().reset(seed, episode_id=episode_id, config=config)


def test_each_traced_step_carries_the_environments_timestep_metadata(serve, mock_policy,
                                                                        api_key, store):
    server = serve(create_app(env_config(LabeledCountEnv), api_keys=[api_key],
                              trace_store=store))
    body = httpx.post(server.url + "/rollout", headers={"X-API-Key": api_key}, timeout=30,
                      json={"run_id": "r3", "env": {},
                            "policy": {"config": {"inference_url": mock_policy.url + "/v1"}},
                            "record": {"return_trace": True}}).json()
    steps = body["trace"]["session_time_steps"]
    assert steps and all(s["step_metadata"] == {"seed": 4, "label": "chosen"} for s in steps)
    with WSEnvClient(server.url + "/openenv", headers={"X-API-Key": api_key}) as env:
        env.reset(episode_id="ep-label")
        env.step({"n": 1})
    wait_for(lambda: any(s.run_id == "ep-label" for s in store.list_sessions(app="count")))
    episode = store.get_session(next(s.session_id for s in store.list_sessions(app="count")
                                     if s.run_id == "ep-label"))
    assert episode.timesteps[0].step_metadata == {"seed": 4, "label": "chosen"}


def test_a_refused_action_is_told_to_the_policy_then_the_noop_plays(serve, api_key):
    from standins.scripted_policy import calls, scripted_policy, tool_call

    policy = serve(scripted_policy([calls(tool_call("add", {"n": 7}, call_id="c1")),
                                    "no call this time", calls(tool_call("add", {"n": 3}))]))
    server = serve(create_app(env_config(), api_keys=[api_key]))
    body = httpx.post(server.url + "/rollout", headers={"X-API-Key": api_key}, timeout=30,
                      json={"run_id": "r2", "env": {"seed": 0},
                            "policy": {"config": {"inference_url": policy.url + "/v1"}}}).json()
    first = body["trajectories"][0]["steps"][0]
    assert first["info"]["reply_problem"] == "n must be 1, 2 or 3, got 7"
    assert first["info"]["noop_after_invalid_replies"] and first["info"]["added"] == 1
    retry = policy.app.state.requests[1]["messages"]
    assert retry[-1] == {"role": "tool", "tool_call_id": "c1",
                         "content": "error: n must be 1, 2 or 3, got 7"}


def test_openenv_clients_play_episodes_over_websocket_each_traced(serve, api_key, store):
    server = serve(create_app(env_config(), api_keys=[api_key], trace_store=store))
    base = server.url + "/openenv"
    for seed in range(3):
        with WSEnvClient(base, headers={"X-API-Key": api_key}) as env:
            first = env.reset(seed=seed, episode_id=f"ep-{seed}")
            assert first["reward"] == 0.0 and not first["done"]  # as OpenEnv's reset has it
            target = first["observation"]["target"]
            result = first
            while not result["done"]:
                result = env.step({"n": 1})
            assert result["reward"] == 1.0 and result["observation"]["total"] == target
            assert env.state() == {"total": target, "episode_id": f"ep-{seed}",
                                   "step_count": target}
    wait_for(lambda: store.count_sessions(app="count") == 3)
    episode = store.get_session(next(s.session_id for s in store.list_sessions(app="count")
                                     if s.run_id == "ep-1"))
    assert episode.metadata["status"] == "ok" and episode.metadata["seed"] == 1
    assert episode.metadata["transport"] == "openenv-ws"
    assert episode.outcome_rewards[-1].total_reward == 1.0
    assert len(episode.timesteps) == 3 + 1 % 5
    assert [r.reward_type for r in episode.event_rewards] == ["progress"] * 4
    assert sessions_of(server, api_key)["active_sessions"] == 0


def test_an_episodes_steps_are_traced_at_the_times_they_came(serve, api_key, store):
    # The trace is built once the episode ends: each step must still carry its own time.
    server = serve(create_app(env_config(), api_keys=[api_key], trace_store=store))
    with WSEnvClient(server.url + "/openenv", headers={"X-API-Key": api_key}) as env:
        first = env.reset(seed=7, episode_id="timed")
        before = time.time()
        for _ in range(first["observation"]["target"]):
            time.sleep(0.15)
            env.step({"n": 1})
    wait_for(lambda: store.count_sessions(app="count") == 1)
    episode = store.get_session(store.list_sessions(app="count")[0].session_id)
    steps = episode.timesteps
    assert len(steps) >= 2 and steps[0].timestamp >= before
    gaps = [b.timestamp - a.timestamp for a, b in itertools.pairwise(steps)]
    assert all(gap >= 0.1 for gap in gaps), gaps
    for step in steps:  # (the store keeps each time to its own precision)
        assert step.messages[0].timestamp == pytest.approx(step.timestamp, abs=1e-3)
        assert step.events[0].event_time == pytest.approx(step.timestamp, abs=1e-3)
    for step, following in itertools.pairwise(steps):
        assert step.completed_at == pytest.approx(following.timestamp, abs=1e-3)
    assert episode.created_at < steps[0].timestamp

def test_a_websocket_session_answers_errors_as_openenv_does(serve, api_key):
    server = serve(create_app(env_config(), api_keys=[api_key]))
    with WSEnvClient(server.url + "/openenv", headers={"Authorization": f"Bearer {api_key}"}
                     ) as env:
        env.reset(seed=0)
        with pytest.raises(ServerError) as refused:
            env.step({"n": 9})
        assert refused.value.code == "VALIDATION_ERROR"
        assert env.step({"n": 2})["observation"]["total"] == 2  # the refusal changed nothing
        with pytest.raises(ServerError) as bad_seed:
            env.reset(seed=-1)
        assert bad_seed.value.code == "VALIDATION_ERROR"
        env.send({"type": "jump"})
        assert env.receive()["data"]["code"] == "UNKNOWN_TYPE"
        env.sock.sendall(env.ws.send(__import__("wsproto").events.Message(data="{nope")))
        assert env.receive()["data"]["code"] == "INVALID_JSON"
        assert env.call({"type": "mcp", "data": {"jsonrpc": "2.0", "id": 1,
                                                 "method": "tools/list"}})["data"]["error"]


class UnscoredEnv(CountEnv):
    """CountEnv whose steps are worth NaN: a scorer that divided by zero."""

    def step(self, action):
        played = super().step(action)
        played.reward, played.observation["score"] = float("nan"), float("nan")
        return played


def test_a_step_worth_nan_is_answered_as_json_with_null_in_its_place(serve, api_key):
    # JSON has no NaN; OpenEnv's own server writes null there (pydantic), and so does the
    # kit, over the WebSocket and over HTTP, where a NaN once went out as a bare NaN.
    server = serve(create_app(env_config(UnscoredEnv), api_keys=[api_key]))
    base, key = server.url + "/openenv", {"X-API-Key": api_key}
    with WSEnvClient(base, headers=key) as env:
        env.reset(seed=0)
        over_ws = env.step({"n": 1})  # (Python's json reads a bare NaN as nan, not None)
    with HTTPEnvClient(base, headers=key) as env:
        env.reset(seed=0)
        over_http = env.http.post("/step", json={"action": {"n": 1}})
    assert "NaN" not in over_http.text, over_http.text
    for answer in (over_ws, over_http.json()):
        assert answer["reward"] is None and answer["observation"]["score"] is None, answer


class UnscoredProgressEnv(CountEnv):
    """CountEnv whose ``progress`` reward is infinite at its second step."""

    def step(self, action):
        played = super().step(action)
        if self.total == 2:
            played.rewards = [Reward("progress", float("inf"))]
        return played


class NanOutcomeEnv(CountEnv):
    """CountEnv whose steps score, but whose episode's outcome divides by zero."""

    def outcome(self, steps):
        return Outcome(reward=float("nan"))


def play_to_the_end(server, api_key) -> list[dict]:
    with WSEnvClient(server.url + "/openenv", headers={"X-API-Key": api_key}) as env:
        played = [env.reset(seed=0)]  # a target of 3: three steps of 1
        while not played[-1]["done"]:
            played.append(env.step({"n": 1}))
    return played


def test_steps_worth_nan_are_answered_and_their_episode_kept_with_null_rewards(
        serve, api_key, store, caplog):
    server = serve(create_app(env_config(UnscoredEnv), api_keys=[api_key], trace_store=store))
    with caplog.at_level("WARNING", logger="synth_deploy.taskapp"):
        played = play_to_the_end(server, api_key)
        wait_for(lambda: store.count_sessions(app="count") == 1)
    assert [answer["reward"] for answer in played[1:]] == [None, None, None]
    [listed] = store.list_sessions(app="count")
    assert listed.status == "ok"
    events = [e for step in store.get_session(listed.session_id).timesteps for e in step.events]
    assert [e.reward for e in events] == [None, None, None]
    assert [e.metadata["rewards_not_finite"] for e in events] == [{"reward": "nan"}] * 3
    warned = [r.getMessage() for r in caplog.records if "not a finite number" in r.getMessage()]
    assert len(warned) == 1 and "3 step(s)" in warned[0] and "first: step 1" in warned[0]


def test_an_infinite_event_reward_is_left_out_and_named(serve, api_key, store):
    server = serve(create_app(env_config(UnscoredProgressEnv), api_keys=[api_key],
                              trace_store=store))
    play_to_the_end(server, api_key)
    wait_for(lambda: store.count_sessions(app="count") == 1)
    episode = store.get_session(store.list_sessions(app="count")[0].session_id)
    assert [r.turn_number for r in episode.event_rewards] == [1, 3]
    events = [e for step in episode.timesteps for e in step.events]
    assert events[1].metadata["rewards_not_finite"] == {"progress": "inf"}
    assert events[2].reward == 1.0 and "rewards_not_finite" not in events[2].metadata


def test_an_outcome_worth_nan_keeps_the_episode_as_a_failure_and_the_step_answered(
        serve, api_key, store):
    server = serve(create_app(env_config(NanOutcomeEnv), api_keys=[api_key],
                              trace_store=store))
    played = play_to_the_end(server, api_key)
    assert played[-1]["done"] is True and played[-1]["reward"] == 1.0
    wait_for(lambda: store.count_sessions(app="count") == 1)
    [listed] = store.list_sessions(app="count")
    assert listed.status == "error"
    episode = store.get_session(listed.session_id)
    assert episode.metadata["error"]["code"] == "reward_not_finite"
    assert "outcome reward must be a finite number, got nan" in \
        episode.metadata["error"]["message"]
    assert episode.metadata["metrics"]["outcome_reward"] is None and not episode.outcome_rewards


def test_openenv_http_clients_play_episodes_by_cookie(serve, api_key, store):
    server = serve(create_app(env_config(), api_keys=[api_key], trace_store=store))
    base = server.url + "/openenv"
    with HTTPEnvClient(base, headers={"X-API-Key": api_key}) as env:
        for seed in (0, 1):
            result = env.reset(seed=seed)
            assert set(result) == {"observation", "reward", "done"}
            while not result["done"]:
                result = env.step({"n": 1})
            assert env.state()["step_count"] == 3 + seed
    # One session served both episodes: a reset names the session it came with.
    assert sessions_of(server, api_key)["active_sessions"] == 1
    wait_for(lambda: store.count_sessions(app="count") == 2)
    assert {s.status for s in store.list_sessions(app="count")} == {"ok"}
    headers = {"X-API-Key": api_key}
    lost = httpx.post(base + "/step", json={"action": {"n": 1}}, headers=headers, timeout=5)
    assert lost.status_code == 409 and "POST /openenv/reset first" in lost.text
    gone = httpx.post(base + "/step", json={"action": {"n": 1}}, timeout=5,
                      headers={**headers, "openenv-session-id": "nope"})
    assert gone.status_code == 404
    named = httpx.post(base + "/reset", json={"seed": 3}, headers=headers, timeout=5)
    session_id = named.headers["openenv-session-id"]
    step = httpx.post(base + "/step", json={"action": {"n": 2}}, timeout=5,
                      headers={**headers, "openenv-session-id": session_id})
    assert step.json()["observation"]["total"] == 2
    assert httpx.post(base + "/step", json={"action": "up"}, timeout=5,
                      headers={**headers, "openenv-session-id": session_id}).status_code == 422


def test_an_http_session_closes_and_never_locks_out_a_websocket_client(serve, api_key, store):
    # One slot (a single-session environment's): OpenEnv's HTTP calls hold none between calls.
    server = serve(create_app(env_config(), api_keys=[api_key], trace_store=store,
                              limits=RolloutLimits(max_in_flight=1)))
    base, headers = server.url + "/openenv", {"X-API-Key": api_key}
    with HTTPEnvClient(base, headers=headers) as http:
        http.reset(seed=0)
        http.step({"n": 1})
        with WSEnvClient(base, headers=headers) as env:  # takes the idle HTTP session's slot
            assert not env.reset(seed=1)["done"]
            refused = httpx.post(base + "/reset", json={}, headers=headers, timeout=5)
            assert refused.status_code == 503  # a session in use is never taken
            lost = http.http.post("/step", json={"action": {"n": 1}})
            assert lost.status_code == 404 and "gives its slot" in lost.text
        wait_for(lambda: sessions_of(server, api_key)["active_sessions"] == 0)
        http.reset(seed=2)
        assert sessions_of(server, api_key)["active_sessions"] == 1
        closed = http.http.post("/close")
        assert closed.status_code == 200 and closed.json()["closed"] is True
        assert sessions_of(server, api_key)["active_sessions"] == 0
        assert http.http.post("/close").status_code == 409  # the cookie went with it
    wait_for(lambda: store.count_sessions(app="count") == 3)
    reasons = {s.metadata.get("error", {}).get("message", "") for s in
               (store.get_session(t.session_id) for t in store.list_sessions(app="count"))}
    assert any("a new session took its slot" in r for r in reasons)
    assert any("the client closed the session" in r for r in reasons)


def test_an_episode_open_when_the_server_stops_is_traced_as_unfinished(api_key, store):
    from synth_deploy.serving import BackgroundServer

    # A client that never closes (OpenEnv's HTTP protocol has no close): its last episode is
    # still open when the server stops, and is traced then, not lost.
    with BackgroundServer(create_app(env_config(), api_keys=[api_key],
                                     trace_store=store)) as server:
        with HTTPEnvClient(server.url + "/openenv", headers={"X-API-Key": api_key}) as env:
            env.reset(seed=0)
            env.step({"n": 1})
    [episode] = store.list_sessions(app="count")
    assert episode.status == "error"  # unfinished: the server stopped


def test_keyless_and_wrong_key_clients_are_refused_and_hold_nothing(serve, api_key):
    server = serve(create_app(env_config(), api_keys=[api_key]))
    base = server.url + "/openenv"
    with pytest.raises(Rejected) as keyless:
        WSEnvClient(base).connect()
    assert keyless.value.status == 401 and b"missing_api_key" in keyless.value.body
    with pytest.raises(Rejected) as wrong:
        WSEnvClient(base, headers={"X-API-Key": "sk_env_wrong"}).connect()
    assert wrong.value.status == 403
    for path in ("/reset", "/step"):
        assert httpx.post(base + path, json={}, timeout=5).status_code == 401
    assert httpx.get(base + "/state", timeout=5).status_code == 401
    assert sessions_of(server, api_key)["active_sessions"] == 0


def test_what_openenv_validate_reads_answers_without_a_key(serve, api_key):
    """The checks of `openenv validate --url` (openenv/cli/_validation.py), against a server
    that requires a key for everything else."""
    server = serve(create_app(env_config(), api_keys=[api_key]))
    base = server.url + "/openenv"
    spec = httpx.get(base + "/openapi.json", timeout=5).json()
    assert spec["info"]["version"].startswith("1.")
    assert {"/reset", "/step", "/state"} <= set(spec["paths"])
    assert httpx.get(base + "/health", timeout=5).json()["status"] == "healthy"
    metadata = httpx.get(base + "/metadata", timeout=5).json()
    assert metadata["name"] == "Toy" and metadata["description"] == "Count to a target."
    schema = httpx.get(base + "/schema", timeout=5).json()
    assert schema["action"]["properties"]["n"]["enum"] == [1, 2, 3]
    assert isinstance(schema["observation"], dict) and isinstance(schema["state"], dict)
    assert schema["reset_observation"] == schema["observation"]
    mcp = httpx.post(base + "/mcp", json={}, timeout=5)
    assert mcp.status_code == 200 and mcp.json()["jsonrpc"] == "2.0"
    # The app's own routes keep their rule.
    assert httpx.get(server.url + "/health", timeout=5).status_code == 401


def test_a_client_that_vanishes_mid_episode_leaves_no_session(serve, api_key, store):
    server = serve(create_app(env_config(), api_keys=[api_key], trace_store=store))
    closed_before = CountEnv.closed
    env = WSEnvClient(server.url + "/openenv", headers={"X-API-Key": api_key}).connect()
    env.reset(seed=4, episode_id="vanished")
    env.step({"n": 1})
    assert sessions_of(server, api_key)["active_sessions"] == 1
    env.vanish()
    wait_for(lambda: sessions_of(server, api_key)["active_sessions"] == 0)
    wait_for(lambda: store.count_sessions(app="count") == 1)
    [episode] = store.list_sessions(app="count")
    assert episode.status == "error" and episode.run_id == "vanished"
    full = store.get_session(episode.session_id)
    assert "the client disconnected" in full.metadata["error"]["message"]
    assert CountEnv.closed == closed_before + 1


def test_an_idle_session_is_reaped_and_its_slot_comes_back(serve, api_key):
    # Idle long enough for the refusals below to come first on a loaded machine.
    server = serve(create_app(env_config(session_idle_seconds=1.5), api_keys=[api_key],
                              limits=RolloutLimits(max_in_flight=1)))
    base, headers = server.url + "/openenv", {"X-API-Key": api_key}
    idle = WSEnvClient(base, headers=headers).connect()
    idle.reset(seed=0)
    with WSEnvClient(base, headers=headers) as second:  # refused at once, not queued
        refusal = second.receive()["data"]
        assert second.closed_by_server.code == 1013  # try again later
    assert refusal["code"] == "CAPACITY_REACHED" and refusal["retry_after_s"] >= 1
    refused = httpx.post(base + "/reset", json={}, headers=headers, timeout=5)
    assert refused.status_code == 503 and refused.headers["retry-after"]
    wait_for(lambda: sessions_of(server, api_key)["active_sessions"] == 0)
    with pytest.raises(ConnectionError):  # told by a close frame, not left hanging
        idle.state()
    idle.vanish()
    with WSEnvClient(base, headers=headers) as again:
        assert not again.reset(seed=1)["done"]


class SlowClosingEnv(CountEnv):
    def close(self):
        time.sleep(0.5)  # the window in which a reaped session's slot shows free
        return super().close()


def test_a_reaped_sessions_socket_is_closed_before_its_slot_shows_free(serve, api_key):
    server = serve(create_app(env_config(SlowClosingEnv, session_idle_seconds=1.0),
                              api_keys=[api_key]))
    idle = WSEnvClient(server.url + "/openenv", headers={"X-API-Key": api_key}).connect()
    idle.reset(seed=0)
    wait_for(lambda: sessions_of(server, api_key)["active_sessions"] == 0)
    with pytest.raises(ConnectionError):  # the close frame, not an answer for a gone session
        idle.state()
    idle.vanish()


class MeetEnv(CountEnv):
    """A sync step that waits at a barrier for every session's step: it returns only when all
    of them run at once (each on its thread), as a slow environment's steps would overlap."""

    barrier: threading.Barrier

    def step(self, action):
        self.barrier.wait()  # BrokenBarrierError after its timeout: a step left queued
        return super().step(action)


def test_sessions_blocked_in_a_sync_step_all_run_at_once(serve, api_key):
    # More sessions than anyio's default thread pool (40): each step gets its thread at once,
    # as OpenEnv's server gives each session one, rather than waiting for another to end.
    crowd = 48
    MeetEnv.barrier = threading.Barrier(crowd, timeout=5)
    server = serve(create_app(env_config(MeetEnv), api_keys=[api_key]))
    clients = [WSEnvClient(server.url + "/openenv", headers={"X-API-Key": api_key}).connect()
               for _ in range(crowd)]
    try:
        for env in clients:
            env.reset(seed=4)
        for env in clients:
            env.send({"type": "step", "data": {"n": 1}})
        answers = [env.receive() for env in clients]
    finally:
        for env in clients:
            env.close()
    assert [a["type"] for a in answers] == ["observation"] * crowd, \
        next(a["data"] for a in answers if a["type"] != "observation")
    assert sessions_of(server, api_key)["max_sessions"] >= crowd


def test_an_app_without_an_environment_serves_no_openenv_routes(serve, api_key):
    server = serve(create_app(toy_config(), api_keys=[api_key]))
    assert httpx.get(server.url + "/openenv/health", headers={"X-API-Key": api_key},
                     timeout=5).status_code == 404


# An environment shaped as OpenEnv's are (its `openenv init` template, an echo), written here
# from OpenEnv's documented interface: the kit wraps it without importing openenv.
from pydantic import BaseModel, ConfigDict, Field  # noqa: E402


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid")
    metadata: dict = Field(default_factory=dict)


class EchoAction(_Base):
    """Message to echo back."""

    message: str


class EchoObservation(_Base):
    done: bool = False
    reward: float | None = None
    echoed_message: str = ""
    message_length: int = 0


class EchoState(BaseModel):
    episode_id: str | None = None
    step_count: int = 0


class EchoEnvironment:
    def __init__(self):
        self._state = EchoState()

    def reset(self, seed=None, episode_id=None, **kwargs):
        self._state = EchoState(episode_id=episode_id, step_count=0)
        return EchoObservation(echoed_message="Echo environment ready!", reward=0.0)

    def step(self, action):
        self._state.step_count += 1
        return EchoObservation(echoed_message=action.message,
                               message_length=len(action.message),
                               reward=min(len(action.message) * 0.1, 1.0),
                               metadata={"step": self._state.step_count})

    @property
    def state(self):
        return self._state

    def close(self):
        pass


def echo_config(**settings):
    from synth_deploy.taskapp import TaskApp

    task_app = TaskApp("echo", name="Echo", description="Echoes messages.", **settings)
    task_app.openenv(EchoEnvironment, EchoAction, max_turns=3)
    return task_app.build_config()


def test_an_openenv_environment_class_becomes_a_task_app(serve, mock_policy, api_key, store):
    server = serve(create_app(echo_config(), api_keys=[api_key], trace_store=store))
    resp = httpx.post(server.url + "/rollout", headers={"X-API-Key": api_key}, timeout=30,
                      json={"run_id": "e1", "env": {"seed": 1},
                            "policy": {"config": {"inference_url": mock_policy.url + "/v1"}}})
    assert resp.status_code == 200, resp.text
    steps = resp.json()["trajectories"][0]["steps"]
    assert len(steps) == 3 and steps[-1]["truncated"]  # the echo never ends: cut at 3
    assert [s["tool_calls"][0]["function"]["name"] for s in steps] == ["echo"] * 3
    assert all(s["info"]["step"] == i + 1 for i, s in enumerate(steps))
    base = server.url + "/openenv"
    schema = httpx.get(base + "/schema", timeout=5).json()["action"]
    assert set(schema["properties"]) == {"message", "metadata"}  # OpenEnv's: the whole class
    assert schema["required"] == ["message"]
    with WSEnvClient(base, headers={"X-API-Key": api_key}) as env:
        assert env.reset(seed=0)["observation"] == {"echoed_message": "Echo environment ready!",
                                                   "message_length": 0, "metadata": {}}
        result = env.step({"message": "hello"})  # OpenEnv 0.10's shape: metadata twice
        assert result == {"observation": {"echoed_message": "hello", "message_length": 5,
                                          "metadata": {"step": 1}},
                          "reward": 0.5, "done": False, "metadata": {"step": 1}}
        with pytest.raises(ServerError) as wrong:
            env.step({"text": "hello"})
        assert wrong.value.code == "VALIDATION_ERROR" and "message" in str(wrong.value)
        assert env.state()["step_count"] == 1
