"""Other people's OpenEnv environments, wrapped as the README says (`task_app.openenv`): served
by the kit as OpenEnv's own server serves them. The environments here are written from
OpenEnv's documented interface, shaped as envs/ of its repository has them (a `reset()` that
takes nothing, a `ValueError` for a bad action, `SUPPORTS_CONCURRENT_SESSIONS`,
`Environment[Action, Observation, State]`); the kit never imports openenv. The real ones, with
OpenEnv's own clients: bench/openenv_third_party.py."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import sqlite3
import sys
import threading
import time
from typing import Generic, TypeVar

import httpx
import pytest
from pydantic import BaseModel, ConfigDict, Field
from standins.openenv_client import ServerError, WSEnvClient
from toy_apps import CountEnv, env_config

from synth_deploy.errors import TaskAppError
from synth_deploy.serving import RolloutLimits, create_app
from synth_deploy.taskapp import InvalidAction, Step, TaskApp, function_tool

ActionT, ObsT, StateT = TypeVar("ActionT"), TypeVar("ObsT"), TypeVar("StateT")


class Environment(Generic[ActionT, ObsT, StateT]):  # OpenEnv's base, as far as the kit reads it
    SUPPORTS_CONCURRENT_SESSIONS = False

    def close(self):
        pass


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MoveAction(_Strict):
    """Move one cell."""

    metadata: dict = Field(default_factory=dict)
    direction: str


class GridObservation(_Strict):
    done: bool = False
    reward: float | None = None
    metadata: dict = Field(default_factory=dict)
    x: int = 0
    message: str = ""


class GridState(BaseModel):
    model_config = ConfigDict(extra="allow")
    episode_id: str | None = None
    step_count: int = 0
    x: int = 0


class GridWorld(Environment[MoveAction, GridObservation, GridState]):
    """grid_world's shape: reset() takes no argument, a bad direction is a ValueError."""

    def __init__(self):
        self._state = GridState()

    def reset(self):
        self._state = GridState()
        return GridObservation(message="at 0; reach 2")

    def step(self, action):
        if action.direction not in ("left", "right"):
            raise ValueError(f"unknown direction {action.direction!r}: left or right")
        self._state.x += 1 if action.direction == "right" else -1
        self._state.step_count += 1
        done = self._state.x == 2
        return GridObservation(x=self._state.x, done=done, reward=float(done))

    @property
    def state(self):
        return self._state


class ConcurrentGrid(GridWorld):
    SUPPORTS_CONCURRENT_SESSIONS = True


def grid_config(env_cls=GridWorld, **openenv):
    task_app = TaskApp("grid", name="Grid", description="Walk right twice.")
    task_app.openenv(env_cls, MoveAction, max_turns=6, **openenv)
    return task_app.build_config()


def ws(server, api_key) -> WSEnvClient:
    return WSEnvClient(server.url + "/openenv", headers={"X-API-Key": api_key})


def test_a_reset_that_takes_no_arguments_plays_over_the_wire_and_rollout(serve, api_key):
    from standins.scripted_policy import calls, scripted_policy, tool_call

    server = serve(create_app(grid_config(), api_keys=[api_key]))
    with ws(server, api_key) as env:
        first = env.reset(seed=3, episode_id="e1")  # both dropped: reset() takes neither
        # As OpenEnv 0.10 serializes it: metadata in the observation, the reward as made.
        assert first == {"observation": {"x": 0, "message": "at 0; reach 2", "metadata": {}},
                         "reward": None, "done": False}
        env.step({"direction": "right"})
        assert env.step({"direction": "right"}) == {
            "observation": {"x": 2, "message": "", "metadata": {}}, "reward": 1.0,
            "done": True}
    policy = serve(scripted_policy([calls(tool_call("move", {"direction": "right"}))]))
    resp = httpx.post(server.url + "/rollout", headers={"X-API-Key": api_key}, timeout=30,
                      json={"run_id": "r1", "env": {"seed": 1},
                            "policy": {"config": {"inference_url": policy.url + "/v1"}}})
    assert resp.status_code == 200, resp.text
    assert resp.json()["metrics"]["outcome_reward"] == 1.0


def test_the_kits_own_reset_gets_only_the_keywords_it_takes(serve, api_key):
    class SeedOnly(CountEnv):
        def reset(self, seed):
            return super().reset(seed, episode_id=None, config={})

    server = serve(create_app(env_config(SeedOnly), api_keys=[api_key]))
    with ws(server, api_key) as env:
        assert env.reset(seed=2)["observation"]["target"] == 5


def test_an_environment_not_safe_for_concurrent_sessions_holds_one(serve, api_key):
    server = serve(create_app(grid_config(), api_keys=[api_key],
                              limits=RolloutLimits(max_in_flight=8)))
    health = httpx.get(server.url + "/openenv/health", timeout=5).json()
    assert health["capacity"]["max_sessions"] == 1
    with ws(server, api_key) as first:
        first.reset()
        with ws(server, api_key) as second:
            refusal = second.receive()["data"]
            assert second.closed_by_server.code == 1013
        assert refusal["code"] == "CAPACITY_REACHED" and refusal["max_sessions"] == 1


def test_a_concurrent_environment_holds_its_own_cap_apart_from_max_rollouts(serve, api_key):
    server = serve(create_app(grid_config(ConcurrentGrid, max_sessions=2), api_keys=[api_key],
                              limits=RolloutLimits(max_in_flight=8)))
    with ws(server, api_key) as one, ws(server, api_key) as two:
        one.reset()
        two.reset()
        with ws(server, api_key) as three:
            assert three.receive()["data"]["code"] == "CAPACITY_REACHED"
    health = httpx.get(server.url + "/health", headers={"X-API-Key": api_key}, timeout=5).json()
    assert health["rollouts"]["max_in_flight"] == 8  # --max-rollouts is its own number
    uncapped = serve(create_app(grid_config(ConcurrentGrid), api_keys=[api_key],
                                limits=RolloutLimits(max_in_flight=3)))
    capacity = httpx.get(uncapped.url + "/openenv/health", timeout=5).json()["capacity"]
    assert capacity["max_sessions"] == 3


def test_sessions_stop_at_what_one_process_holds_unless_the_environment_says_more(serve,
                                                                                 api_key):
    limits = RolloutLimits(max_in_flight=10_000)
    default = serve(create_app(grid_config(ConcurrentGrid), api_keys=[api_key], limits=limits))
    capacity = httpx.get(default.url + "/openenv/health", timeout=5).json()["capacity"]
    assert capacity["max_sessions"] == 4096  # as the README says
    declared = serve(create_app(grid_config(ConcurrentGrid, max_concurrent_envs=6000),
                                api_keys=[api_key], limits=limits))
    capacity = httpx.get(declared.url + "/openenv/health", timeout=5).json()["capacity"]
    assert capacity["max_sessions"] == 6000


def test_a_declared_environment_sets_its_own_session_cap(serve, api_key):
    class Scarce(CountEnv):
        max_sessions = 2

    server = serve(create_app(env_config(Scarce), api_keys=[api_key],
                              limits=RolloutLimits(max_in_flight=8)))
    capacity = httpx.get(server.url + "/openenv/health", timeout=5).json()["capacity"]
    assert capacity["max_sessions"] == 2


def test_more_than_one_session_of_an_unsafe_environment_is_refused_when_declared():
    with pytest.raises(TaskAppError) as refused:
        grid_config(GridWorld, max_sessions=4)
    assert "SUPPORTS_CONCURRENT_SESSIONS" in str(refused.value)
    assert refused.value.hint and "max_sessions" in refused.value.hint


def test_a_value_error_on_a_bad_action_goes_back_to_the_policy_once(serve, api_key, caplog):
    from standins.scripted_policy import calls, scripted_policy, tool_call

    policy = serve(scripted_policy([calls(tool_call("move", {"direction": "up"}, "c1")),
                                    calls(tool_call("move", {"direction": "right"}))]))
    server = serve(create_app(grid_config(), api_keys=[api_key]))
    with caplog.at_level(logging.ERROR, logger="synth_deploy.taskapp"):
        resp = httpx.post(server.url + "/rollout", headers={"X-API-Key": api_key}, timeout=30,
                          json={"run_id": "r2", "env": {"seed": 0},
                                "policy": {"config": {"inference_url": policy.url + "/v1"}}})
        assert resp.status_code == 200, resp.text
        first = resp.json()["trajectories"][0]["steps"][0]
        assert "unknown direction 'up'" in first["info"]["reply_problem"]
        assert not first["info"]["noop_after_invalid_replies"]
        told = policy.app.state.requests[1]["messages"][-1]
        assert told["tool_call_id"] == "c1" and "left or right" in told["content"]
        with ws(server, api_key) as env:
            env.reset()
            with pytest.raises(ServerError) as refused:
                env.step({"direction": "up"})
            assert refused.value.code == "VALIDATION_ERROR"
            assert env.step({"direction": "right"})["observation"]["x"] == 1
    assert not caplog.records  # a refused action is the policy's error, not the app's


def test_a_step_before_reset_is_a_clear_error_not_an_app_failure(serve, api_key, caplog):
    server = serve(create_app(env_config(), api_keys=[api_key]))
    with caplog.at_level(logging.ERROR, logger="synth_deploy.taskapp"), \
            ws(server, api_key) as env:
        with pytest.raises(ServerError) as early:
            env.step({"n": 1})
        assert early.value.code == "VALIDATION_ERROR"
        assert "reset first" in str(early.value)
        assert env.reset(seed=0)["done"] is False
    assert not caplog.records


def test_schema_gives_observation_and_state_from_the_declaration(serve, api_key):
    server = serve(create_app(grid_config(), api_keys=[api_key]))
    schema = httpx.get(server.url + "/openenv/schema", timeout=5).json()
    # OpenEnv's /schema: each model's own schema, the reset's observation beside the step's.
    assert schema["observation"] == GridObservation.model_json_schema()
    assert schema["reset_observation"] == schema["observation"]
    assert schema["state"] == GridState.model_json_schema()
    assert schema["action"] == MoveAction.model_json_schema()


class SizedGrid(GridWorld):
    """wildfire's shape: a size the class defaults, an app.py's factory sets; a state whose
    step_count is the environment's own (it counts moves twice)."""

    def __init__(self, size: int = 32):
        super().__init__()
        self.size = size

    def reset(self):
        first = super().reset()
        self._state.x = 0
        return first

    def step(self, action):
        result = super().step(action)
        self._state.step_count += 1
        return result

    @property
    def state(self):
        return GridState(**{**self._state.model_dump(), "size": self.size})


def create_sized_grid():
    return SizedGrid(size=16)


def test_a_factory_is_served_as_it_builds_the_environment(serve, api_key):
    task_app = TaskApp("sized", name="Sized", description="A factory's grid.")
    # create_app's own arguments, as an app.py passes them
    task_app.openenv(create_sized_grid, MoveAction, GridObservation, env_name="sized_env",
                     max_concurrent_envs=1)
    server = serve(create_app(task_app.build_config(), api_keys=[api_key]))
    with ws(server, api_key) as env:
        env.reset(episode_id="e1")
        env.step({"direction": "right"})
        assert env.state() == {"episode_id": None, "step_count": 2, "x": 1, "size": 16}
    schema = httpx.get(server.url + "/openenv/schema", timeout=5).json()
    assert schema["state"] == GridState.model_json_schema()  # read off the factory's class
    assert schema["reset_observation"] == GridObservation.model_json_schema()


def test_create_apps_session_arguments_must_agree_and_stay_safe():
    with pytest.raises(TaskAppError) as unsafe:
        TaskApp("f1", name="F", description="d").openenv(create_sized_grid, MoveAction,
                                                          max_concurrent_envs=2)
    assert "SizedGrid" in str(unsafe.value)  # the factory's class, learned by calling it
    with pytest.raises(TaskAppError) as both:
        TaskApp("f2", name="F", description="d").openenv(GridWorld, MoveAction,
                                                          max_concurrent_envs=1, max_sessions=2)
    assert "disagree" in str(both.value)
    with pytest.raises(TaskAppError) as unknown:
        TaskApp("f3", name="F", description="d").openenv(GridWorld, MoveAction, mode="prod")
    assert "'mode'" in str(unknown.value)


class Observation(_Strict):  # OpenEnv's base, beside its State (types.py has both)
    done: bool = False
    reward: float | None = None
    metadata: dict = Field(default_factory=dict)


class State(BaseModel):
    episode_id: str | None = None
    step_count: int = 0


class CellObservation(Observation):
    x: int = 0


def test_without_state_cls_the_schema_is_openenvs_state_as_create_app_publishes_it(serve,
                                                                                   api_key):
    task_app = TaskApp("cell", name="Cell", description="d")
    task_app.openenv(GridWorld, MoveAction, CellObservation)  # GridWorld declares GridState
    server = serve(create_app(task_app.build_config(), api_keys=[api_key]))
    schema = httpx.get(server.url + "/openenv/schema", timeout=5).json()
    assert schema["state"] == State.model_json_schema()
    assert schema["observation"] == CellObservation.model_json_schema()


class Strict(CountEnv):
    tool = function_tool("add", "Add 1, 2 or 3.", {
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
        "additionalProperties": False})


def test_an_action_with_a_field_the_schema_forbids_is_refused(serve, api_key):
    server = serve(create_app(env_config(Strict), api_keys=[api_key]))
    with ws(server, api_key) as env:
        env.reset(seed=0)
        with pytest.raises(ServerError) as extra:
            env.step({"n": 1, "sneaky": True})
        assert extra.value.code == "VALIDATION_ERROR" and "'sneaky'" in str(extra.value)
        with pytest.raises(ServerError) as missing:
            env.step({})
        assert "'n'" in str(missing.value)
        assert env.step({"n": 1})["observation"]["total"] == 1  # nothing changed before


class Corridor:
    """Each turn exactly one move is legal, and the tool says which: read once per episode,
    it goes stale after the first step."""

    def tool(self):
        return function_tool("move", "Take the one legal move.", {
            "type": "object", "properties": {"move": {"type": "string",
                                                      "enum": [f"m{self.at}"]}},
            "required": ["move"]})

    def reset(self, seed, *, episode_id, config):
        self.at = 0
        return {"text": "Walk the corridor: 4 moves."}

    def step(self, action):
        if action["move"] != f"m{self.at}":
            raise InvalidAction(f"the only legal move is m{self.at}")
        self.at += 1
        return Step({"text": f"at {self.at}"}, reward=1.0, done=self.at == 4)


def rollout(server, api_key, policy_url, run_id="r"):
    resp = httpx.post(server.url + "/rollout", headers={"X-API-Key": api_key}, timeout=30,
                      json={"run_id": run_id, "env": {"seed": 0},
                            "policy": {"config": {"inference_url": policy_url}}})
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_a_tool_whose_legal_moves_change_is_read_each_turn(serve, mock_policy, api_key):
    server = serve(create_app(env_config(Corridor), api_keys=[api_key]))
    body = rollout(server, api_key, mock_policy.url + "/v1")
    steps = body["trajectories"][0]["steps"]
    assert len(steps) == 4 and body["metrics"]["outcome_reward"] == 4.0
    assert body["metrics"]["details"]["ended"] == "done at turn 4"


def test_why_an_episode_ended_is_in_its_details(serve, api_key):
    from standins.scripted_policy import scripted_policy

    policy = serve(scripted_policy(["I will not call a tool."]))
    server = serve(create_app(env_config(Corridor), api_keys=[api_key]))
    body = rollout(server, api_key, policy.url + "/v1")
    ended = body["metrics"]["details"]["ended"]
    assert ended.startswith("no valid action at turn 1, twice (no tool call)"), ended
    assert "noop" in ended


def test_openenvs_probes_at_the_app_root_are_told_the_base_url(serve, api_key):
    server = serve(create_app(env_config(), api_keys=[api_key]))
    for method, path in (("GET", "/metadata"), ("GET", "/schema"), ("POST", "/mcp")):
        resp = httpx.request(method, server.url + path, json={}, timeout=5)
        assert resp.status_code == 404
        assert f"the base URL {server.url}/openenv" in resp.text, resp.text


# OpenEnv's MCP actions and an environment built on them, shaped as openenv's mcp_types and
# envs/echo_env have them: tools listed and called through step.
class ListToolsAction(_Strict):
    metadata: dict = Field(default_factory=dict)
    type: str = "list_tools"


class CallToolAction(_Strict):
    metadata: dict = Field(default_factory=dict)
    type: str = "call_tool"
    tool_name: str
    arguments: dict = Field(default_factory=dict)


class ToolsObservation(_Strict):
    done: bool = False
    reward: float | None = None
    metadata: dict = Field(default_factory=dict)
    tools: list = Field(default_factory=list)


class CalledObservation(_Strict):
    done: bool = False
    reward: float | None = None
    metadata: dict = Field(default_factory=dict)
    tool_name: str = ""
    result: dict | None = None
    error: dict | None = None


class EchoTools(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def reset(self, seed=None, episode_id=None, **kwargs):
        return ToolsObservation()

    def step(self, action):
        if isinstance(action, ListToolsAction):
            return ToolsObservation(tools=[{"name": "echo", "description": "Echo it.",
                                            "input_schema": {"type": "object"}}])
        if action.tool_name != "echo":
            return CalledObservation(tool_name=action.tool_name,
                                     error={"message": f"no tool {action.tool_name}"})
        return CalledObservation(tool_name="echo", reward=1.0,
                                 result={"data": action.arguments.get("message")})

    @property
    def state(self):
        return GridState()


def test_mcp_is_served_as_openenvs_server_serves_it(serve, api_key):
    task_app = TaskApp("echo-tools", name="Echo", description="Echo over MCP.")
    task_app.openenv(EchoTools, CallToolAction)
    server = serve(create_app(task_app.build_config(), api_keys=[api_key]))
    mcp, key = server.url + "/openenv/mcp", {"X-API-Key": api_key}

    def rpc(method, headers=key, **params):
        return httpx.post(mcp, headers=headers, timeout=10, json={
            "jsonrpc": "2.0", "id": 7, "method": method, "params": params})

    assert httpx.post(mcp, json={}, timeout=5).json()["error"]["code"] == -32600  # validate
    assert rpc("tools/list", headers={}).status_code == 401  # its methods take the key
    session_id = rpc("openenv/session/create").json()["result"]["session_id"]
    tools = rpc("tools/list", session_id=session_id).json()["result"]["tools"]
    assert [t["name"] for t in tools] == ["echo"]
    called = rpc("tools/call", session_id=session_id, name="echo",
                 arguments={"message": "hi"}).json()
    assert called == {"jsonrpc": "2.0", "id": 7, "result": {"data": "hi"}}
    missing = rpc("tools/call", session_id=session_id, name="nope").json()["error"]
    assert "no tool nope" in missing["message"]
    assert rpc("openenv/session/close", session_id=session_id).json()["result"]["closed"]
    assert "Unknown session_id" in rpc("tools/list", session_id=session_id).json()[
        "error"]["message"]
    with ws(server, api_key) as env:  # over the WebSocket: as step actions, and as JSON-RPC
        listed = env.step({"type": "list_tools"})["observation"]["tools"]  # before a reset
        assert listed[0]["name"] == "echo"
        env.reset()
        listed = env.step({"type": "list_tools"})["observation"]["tools"]
        assert listed[0]["name"] == "echo"
        answer = env.call({"type": "mcp", "data": {"jsonrpc": "2.0", "id": 1,
                                                   "method": "tools/list", "params": {}}})
        assert answer["data"]["result"]["tools"][0]["name"] == "echo"


def test_an_mcp_environments_tools_are_the_policys_in_the_episode_loop(serve, api_key):
    from standins.scripted_policy import calls, scripted_policy, tool_call

    policy = serve(scripted_policy([calls(tool_call("echo", {"message": "hi"}))]))
    task_app = TaskApp("echo-tools", name="Echo", description="Echo over MCP.")
    task_app.openenv(EchoTools, CallToolAction, max_turns=2)
    server = serve(create_app(task_app.build_config(), api_keys=[api_key]))
    body = rollout(server, api_key, policy.url + "/v1")
    offered = policy.app.state.requests[0]["tools"]
    assert [t["function"]["name"] for t in offered] == ["echo"]
    steps = body["trajectories"][0]["steps"]
    assert [s["tool_calls"][0]["function"]["name"] for s in steps] == ["echo", "echo"]
    assert body["metrics"]["outcome_reward"] == 2.0


def test_a_client_that_cannot_send_headers_keeps_a_key_in_its_base_url(serve, api_key):
    # openenv-core <= 0.3's clients take a base URL and send no headers.
    server = serve(create_app(env_config(), api_keys=[api_key]))
    keyed = f"{server.url}/openenv/key/{api_key}"
    with WSEnvClient(keyed) as env:
        assert env.reset(seed=1)["done"] is False
        assert env.step({"n": 1})["observation"]["total"] == 1
    first = httpx.post(keyed + "/reset", json={"seed": 0}, timeout=5)
    assert first.status_code == 200, first.text
    wrong = httpx.post(f"{server.url}/openenv/key/sk_env_wrong/reset", json={}, timeout=5)
    assert wrong.status_code == 403 and api_key not in wrong.text
    assert httpx.get(keyed + "/health", timeout=5).json()["status"] == "healthy"


class OneAtATime(CountEnv):
    """Not safe to run twice in one process: each episode ends at a slow reset."""

    max_sessions = 1
    live = peak = 0  # instances made and not yet closed
    resetting = threading.Event()  # an episode holds the one slot

    def __init__(self):
        OneAtATime.live += 1
        OneAtATime.peak = max(OneAtATime.peak, OneAtATime.live)

    async def reset(self, seed, *, episode_id, config):
        OneAtATime.resetting.set()
        await asyncio.sleep(0.3)
        return Step({"text": "nothing to do"}, done=True)

    def close(self):
        OneAtATime.live -= 1


def test_max_sessions_holds_for_rollout_episodes_and_openenv_sessions_together(serve,
                                                                               api_key):
    server = serve(create_app(env_config(OneAtATime, app_id="one"), api_keys=[api_key]))

    async def episodes(count: int) -> list[int]:
        async with httpx.AsyncClient(timeout=30) as client:
            answers = await asyncio.gather(*(client.post(
                server.url + "/rollout", headers={"X-API-Key": api_key},
                json={"run_id": f"one-{i}", "env": {"seed": i},
                      "policy": {"config": {"model": "m",
                                            "inference_url": "http://127.0.0.1:9/v1"}}})
                for i in range(count)))
        return [a.status_code for a in answers]

    def while_an_episode_runs() -> dict:
        assert OneAtATime.resetting.wait(10)
        with ws(server, api_key) as session:
            refusal = session.receive()["data"]
        return refusal

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        refused = pool.submit(while_an_episode_runs)
        started = time.monotonic()
        assert asyncio.run(episodes(3)) == [200] * 3  # each waited its turn
        took = time.monotonic() - started
    assert (OneAtATime.peak, OneAtATime.live) == (1, 0) and took >= 3 * 0.3
    assert refused.result()["code"] == "CAPACITY_REACHED"
    with ws(server, api_key) as session:  # the slot came back
        assert session.reset(seed=1)["done"] is True


class SqliteGrid(ConcurrentGrid):
    """An environment holding what only its own thread may use: Python's sqlite3 refuses a
    connection used from a thread other than the one that made it."""

    def __init__(self):
        super().__init__()
        self.db = sqlite3.connect(":memory:")
        self.db.execute("create table moves (direction text)")

    def step(self, action):
        self.db.execute("insert into moves values (?)", (action.direction,))
        observation = super().step(action)
        observation.message = f"{self.db.execute('select count(*) from moves').fetchone()[0]}"
        return observation

    def close(self):
        self.db.close()


def test_an_environment_lives_on_one_thread_as_in_openenvs_server(serve, api_key):
    """Made, reset, stepped and closed on its own thread, whichever sessions run between its
    calls: two WebSocket sessions taking turns, and a /rollout episode."""
    from standins.scripted_policy import calls, scripted_policy, tool_call

    server = serve(create_app(grid_config(SqliteGrid), api_keys=[api_key]))
    with ws(server, api_key) as one, ws(server, api_key) as two:
        one.reset()
        two.reset()
        for moves in ("1", "2"):
            for env in (one, two):
                assert env.step({"direction": "right"})["observation"]["message"] == moves
    policy = serve(scripted_policy([calls(tool_call("move", {"direction": "right"}))]))
    body = rollout(server, api_key, policy.url + "/v1")
    assert body["metrics"]["outcome_reward"] == 1.0, body
    steps = body["trajectories"][0]["steps"]  # each shows the observation it acted on
    assert len(steps) == 2 and '"message": "1"' in steps[1]["obs"]["text"], steps


def test_the_gils_switch_interval_grows_with_the_sessions_held_and_comes_back(serve, api_key):
    """A session's environment has a thread of its own. Thousands of those ending their steps
    at once starved the loop at CPython's 5-ms switch interval (bench/openenv_scaling.py):
    past fifty the interval grows with them, 100 µs each, and is what it was once they
    close."""
    before = sys.getswitchinterval()
    server = serve(create_app(grid_config(ConcurrentGrid), api_keys=[api_key],
                              limits=RolloutLimits(max_in_flight=1024)))
    with httpx.Client(base_url=server.url + "/openenv", headers={"X-API-Key": api_key},
                      timeout=10) as client:
        sessions = []
        for _ in range(120):  # past the threads CPython's own interval holds
            client.cookies.clear()  # each /reset without one opens a session
            sessions.append(client.post("/reset", json={}).headers["openenv-session-id"])
        assert sys.getswitchinterval() == pytest.approx(max(before, 120 * 100e-6))
        client.cookies.clear()
        for session in sessions:
            assert client.post("/close", headers={"openenv-session-id": session}).is_success
    assert sys.getswitchinterval() == before
