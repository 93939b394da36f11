"""The crafter task app over HTTP (real uvicorn): reward accounting, the tool-call protocol with
malformed replies, image observations, early death, task instances, and /health while
rollouts play."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
import pytest
from standins.openenv_client import HTTPEnvClient, ServerError, WSEnvClient
from standins.scripted_policy import calls, interact, scripted_policy, tool_call

from synth_deploy.serving import create_app
from synth_deploy.taskapp.registry import load_app
from synth_deploy.tracing import open_trace_store

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "apps" / "crafter"))
from crafter_prompt import NO_CALL  # noqa: E402
from crafter_world import TIERS, Episode  # noqa: E402

# Seed 0 (easy): walk to a tree, take its wood, take a second tree's, place a table.
WOOD_SCRIPT = [interact("move_up", "move_left", "move_left", "move_left", "move_left"),
               interact("do"), interact("move_up", "move_left", "move_left", "do"),
               interact("move_right", "place_table")]


@pytest.fixture
def crafter_server(serve, api_key):
    return serve(create_app(load_app("crafter").build_config(), api_keys=[api_key]))


def play(url, api_key, seed, inference_url, **env_config) -> httpx.Response:
    return httpx.post(url + "/rollout", headers={"X-API-Key": api_key}, timeout=120, json={
        "run_id": f"crafter-{seed}", "env": {"seed": seed, "config": env_config},
        "policy": {"policy_name": "test", "config": {"model": "scripted",
                                                     "inference_url": inference_url}},
        "record": {"return_trace": True}})


def test_a_scripted_game_gets_exactly_its_rewards(serve, crafter_server, api_key):
    policy = serve(scripted_policy(WOOD_SCRIPT))
    resp = play(crafter_server.url, api_key, 0, policy.url + "/v1", max_turns=4)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    m, trace = body["metrics"], body["trace"]
    rewards = [(r["reward_type"], r["reward_value"], r["turn_number"])
               for r in trace["event_rewards"]]
    assert rewards == [("achievement_delta", 0.0, 1), ("achievement_delta", 1.0, 2),
                       ("unique_achievement_delta", 1.0, 2), ("achievement_delta", 1.0, 3),
                       ("achievement_delta", 1.0, 4), ("unique_achievement_delta", 1.0, 4)]
    assert [r["annotation"]["achievements"] for r in trace["event_rewards"][1:3]] == [
        {"collect_wood": 1}, ["collect_wood"]]
    [outcome] = trace["outcome_rewards"]
    assert outcome["total_reward"] == 2.0 and outcome["achievements_count"] == 2
    assert m["outcome_reward"] == m["reward_mean"] == m["mean_return"] == 2.0
    assert m["event_rewards"] == [0.0, 1.0, 1.0, 1.0, 1.0, 1.0] and m["num_steps"] == 4
    details = m["details"]
    assert details["unlocked"] == ["collect_wood", "place_table"]
    assert details["achievements"] == 2 and details["achievement_share"] == round(2 / 22, 4)
    assert details["valid_first_replies"] == 4 and details["env_steps"] == 12
    # Rubric scores: outcome = (share + 0.25 * survival) / 1.25; events = mean of the share
    # of turns that earned an achievement (3 of 4) and that unlocked one (2 of 4).
    survival = details["rubric"]["outcome"]["survival"]
    assert survival == round((7 + 9 + 9 + 9) / 36, 4)  # a zombie hit twice
    assert m["outcome_score"] == pytest.approx((2 / 22 + 0.25 * survival) / 1.25, abs=1e-4)
    assert m["events_score"] == pytest.approx((3 / 4 + 2 / 4) / 2)
    [trajectory] = body["trajectories"]
    assert [s["reward"] for s in trajectory["steps"]] == [0.0, 1.0, 1.0, 1.0]
    assert [s["info"]["actions"] for s in trajectory["steps"]][1] == ["do"]
    assert trajectory["steps"][-1]["done"] and trajectory["steps"][-1]["truncated"]
    envs = [e for e in trace["event_history"] if e["event_type"] == "environment"]
    assert [e["reward"] for e in envs] == [0.0, 1.0, 1.0, 1.0]
    assert envs[-1]["metadata"]["actions"] == ["move_right", "place_table"]
    assert envs[-1]["system_state_after"]["achievements"] == ["collect_wood", "place_table"]


def test_the_mock_policy_plays_a_seed_the_same_way_every_time(crafter_server, mock_policy,
                                                              api_key):
    def actions_and_rewards(seed):
        body = play(crafter_server.url, api_key, seed, mock_policy.url + "/v1",
                    max_turns=12).json()
        return [(s["info"]["actions"], s["reward"]) for s in body["trajectories"][0]["steps"]]

    first = actions_and_rewards(3)
    assert actions_and_rewards(3) == first
    assert actions_and_rewards(6) != first
    assert all(actions for actions, _ in first)


def test_the_policy_is_offered_the_interact_tool_and_shown_earlier_turns(
        serve, crafter_server, api_key):
    policy = serve(scripted_policy(WOOD_SCRIPT))
    assert play(crafter_server.url, api_key, 0, policy.url + "/v1", max_turns=3,
                history_turns=1).status_code == 200
    first, _, third = policy.app.state.requests
    tool = first["tools"][0]["function"]
    assert tool["name"] == "interact" and len(tool["parameters"]["properties"]["actions"][
        "items"]["enum"]) == 17
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    # One earlier turn shown: its observation, the call, and the call's result.
    assert [m["role"] for m in third["messages"]] == ["system", "user", "assistant", "tool",
                                                       "user"]
    assert third["messages"][2]["tool_calls"] == WOOD_SCRIPT[1]["tool_calls"]
    assert third["messages"][3] == {
        "role": "tool", "tool_call_id": WOOD_SCRIPT[1]["tool_calls"][0]["id"],
        "content": "Took do. Earned: collect_wood (new!)."}
    assert third["messages"][-1]["content"].startswith("Turn 3 of 3 (step 6).")


def test_a_reply_without_a_call_gets_one_correction_then_plays(serve, crafter_server, api_key):
    policy = serve(scripted_policy(["I would go left.", interact("move_left")]))
    body = play(crafter_server.url, api_key, 0, policy.url + "/v1", max_turns=1).json()
    retry = policy.app.state.requests[1]["messages"]
    assert retry[-2] == {"role": "assistant", "content": "I would go left."}
    assert retry[-1] == {"role": "user", "content": NO_CALL}
    [step] = body["trajectories"][0]["steps"]
    assert step["info"]["actions"] == ["move_left"] and step["info"]["reply_problem"] == \
        "no tool call"
    assert body["metrics"]["details"]["valid_first_replies"] == 0
    # The turn's conversation is stored once, in order, though the policy was called twice.
    [turn] = body["trace"]["session_time_steps"]
    assert [m["message_type"] for m in turn["markov_blanket_messages"]] == [
        "system", "user", "assistant", "user", "assistant"]
    assert turn["markov_blanket_messages"][-1]["metadata"]["tool_calls"][0]["function"][
        "name"] == "interact"
    assert [e["event_type"] for e in turn["events"]] == ["cais", "cais", "environment"]


def test_a_second_miss_makes_the_turn_a_noop_and_every_call_is_answered(
        serve, crafter_server, api_key):
    broken = calls(tool_call("interact", '{"actions": ["do"', call_id="broken"))
    policy = serve(scripted_policy(["hmm", broken, interact("do")]))
    body = play(crafter_server.url, api_key, 0, policy.url + "/v1", max_turns=2).json()
    first, second = body["trajectories"][0]["steps"]
    assert first["info"]["actions"] == ["noop"] and first["info"]["noop_after_invalid_replies"]
    assert first["tool_calls"] == [] and second["info"]["actions"] == ["do"]
    # Turn 2 sees turn 1 as it happened: the miss, the correction, the broken call and the
    # tool error that answers it, then the new observation.
    history = policy.app.state.requests[2]["messages"]
    assert [m["role"] for m in history] == ["system", "user", "assistant", "user", "assistant",
                                            "tool", "user"]
    assert history[5]["tool_call_id"] == "broken"
    assert history[5]["content"].startswith("error: arguments are not valid JSON")


def test_a_broken_call_is_answered_by_a_tool_error_before_the_retry(
        serve, crafter_server, api_key):
    wrong = calls(tool_call("interact", {"actions": ["jump"]}, call_id="j1"))
    policy = serve(scripted_policy([wrong, interact("noop")]))
    body = play(crafter_server.url, api_key, 0, policy.url + "/v1", max_turns=1).json()
    retry = policy.app.state.requests[1]["messages"]
    assert retry[-1]["role"] == "tool" and retry[-1]["tool_call_id"] == "j1"
    assert retry[-1]["content"].startswith("error: unknown action(s) 'jump'; valid actions:")
    assert body["trajectories"][0]["steps"][0]["info"]["reply_problem"].startswith(
        "unknown action(s) 'jump'")


def test_only_the_first_valid_call_runs_and_every_call_is_answered(
        serve, crafter_server, api_key):
    reply = calls(tool_call("move", {"actions": ["do"]}, call_id="a"),
                  tool_call("interact", {"actions": ["do"] * 7}, call_id="b"),
                  tool_call("interact", {"actions": ["noop"]}, call_id="c"))
    policy = serve(scripted_policy([reply, interact("noop")]))
    body = play(crafter_server.url, api_key, 0, policy.url + "/v1", max_turns=2).json()
    first = body["trajectories"][0]["steps"][0]
    assert first["info"]["actions"] == ["do"] * 5 and first["tool_calls"][0]["id"] == "b"
    answers = policy.app.state.requests[1]["messages"][-4:-1]
    assert [a["tool_call_id"] for a in answers] == ["a", "b", "c"]
    assert answers[0]["content"] == "error: unknown tool 'move'; the only tool is interact"
    assert answers[1]["content"].startswith("Took do, do, do, do, do. (only the first 5")
    assert answers[2]["content"] == "error: not executed: one interact call per turn"


def test_image_observations_are_png_data_urls_for_the_current_turn_only(
        serve, crafter_server, api_key):
    from PIL import Image

    policy = serve(scripted_policy([interact("noop")]))
    body = play(crafter_server.url, api_key, 0, policy.url + "/v1", max_turns=2,
                image_observation=True, image_size=96).json()
    first, second = (r["messages"] for r in policy.app.state.requests)
    text, image = first[-1]["content"]
    assert text["type"] == "text" and text["text"].startswith("Turn 1 of 2")
    url = image["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    frame = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert frame.size == (96, 96)
    expected = Episode(0, TIERS["easy"]).png(96)
    assert base64.b64decode(url.split(",", 1)[1]) == expected  # the seed's first frame
    assert isinstance(second[1]["content"], str)  # earlier turns: text only
    assert second[-1]["content"][1]["type"] == "image_url"
    stored = body["trace"]["session_time_steps"][0]["markov_blanket_messages"][1]
    assert stored["content"][1]["image_url"]["url"] == url  # a viewer can show it


@pytest.mark.parametrize(("config", "field"), [
    ({"max_turns": 0}, "env.config.max_turns"),
    ({"max_actions_per_turn": "5"}, "env.config.max_actions_per_turn"),
    ({"difficulty": "nightmare"}, "env.config.difficulty"),
    ({"image_observation": "yes"}, "env.config.image_observation"),
])
def test_a_bad_env_config_is_a_422_naming_the_field(crafter_server, api_key, config, field):
    resp = play(crafter_server.url, api_key, 0, "http://127.0.0.1:9/v1", **config)
    assert resp.status_code == 422, resp.text
    assert field in resp.text


def test_death_ends_the_episode_early(serve, crafter_server, api_key):
    # Seed 2 is hard: hurt, hungry and thirsty; waiting out sixteen steps a turn kills.
    policy = serve(scripted_policy([interact(*["noop"] * 16)]))
    body = play(crafter_server.url, api_key, 2, policy.url + "/v1", max_turns=20,
                max_actions_per_turn=16).json()
    steps = body["trajectories"][0]["steps"]
    assert len(steps) == 8 and steps[-1]["done"] and not steps[-1]["truncated"]
    assert not any(s["done"] for s in steps[:-1])
    details = body["metrics"]["details"]
    assert details["died"] and details["difficulty"] == "hard"
    assert details["rubric"]["outcome"]["survival"] == 0.0
    last_env = [e for e in body["trace"]["event_history"] if e["event_type"] == "environment"][-1]
    assert last_env["terminated"] is True


def test_task_instances_describe_each_seed(crafter_server, api_key):
    headers = {"X-API-Key": api_key}
    infos = httpx.get(crafter_server.url + "/task_info?seeds=1,1000000,5", headers=headers,
                      timeout=10).json()
    assert [i["task_metadata"]["difficulty"] for i in infos] == ["normal", "normal", "hard"]
    assert [i["task_metadata"]["split"] for i in infos] == ["train", "test", "train"]
    assert infos[2]["task_metadata"]["start"] == {"health": 5, "food": 2, "drink": 2}
    assert infos[0]["task_metadata"]["world_size"] == [64, 64]
    taskset = httpx.get(crafter_server.url + "/task_info", headers=headers, timeout=10).json()
    assert taskset["taskset"]["tiers"] == ["easy", "normal", "hard"]
    assert len(taskset["taskset"]["achievements"]) == 22


def test_health_answers_while_16_rollouts_play(serve, crafter_server, mock_policy, api_key):
    """No /health waits for an environment: world generation (the longest piece of CPU work,
    measured here first) and every step run off the event loop."""
    fresh_seeds = [3000 + 3 * i for i in range(5)]  # easy worlds no other test generated
    started = time.perf_counter()
    Episode(fresh_seeds.pop(), TIERS["easy"])
    generation_s = time.perf_counter() - started
    headers = {"X-API-Key": api_key}

    async def main():
        async with httpx.AsyncClient(base_url=crafter_server.url, headers=headers,
                                     timeout=120) as client:
            async def one(i: int):
                return await client.post("/rollout", json={
                    "run_id": f"load-{i}", "env": {"seed": fresh_seeds[i % 4],
                                                   "config": {"max_turns": 4}},
                    "policy": {"config": {"model": "mock",
                                          "inference_url": mock_policy.url + "/v1"}}})

            async def health(latencies: list[float]):
                t0 = time.perf_counter()
                assert (await client.get("/health")).status_code == 200
                latencies.append(time.perf_counter() - t0)

            latencies: list[float] = []
            rollouts = asyncio.gather(*(one(i) for i in range(16)))
            probes = []
            while not rollouts.done():  # a probe every 20 ms, not waiting for the last one
                probes.append(asyncio.ensure_future(health(latencies)))
                await asyncio.sleep(0.02)
            await asyncio.gather(*probes)
            return await rollouts, latencies

    responses, latencies = asyncio.run(main())
    assert [r.status_code for r in responses] == [200] * 16
    assert len(latencies) >= 20
    p90 = statistics.quantiles(latencies, n=10)[-1]
    assert p90 < generation_s / 4, (p90, generation_s)


def test_an_episode_plays_through_a_tunnel(tmp_path, crafter_server, mock_policy, api_key):
    """The crafter app behind the cloudflared stand-in: a quick tunnel's forwarder carries a
    whole rollout (its long response included)."""
    from standins.cloudflared_helpers import COMMAND, StandinState

    from synth_deploy.tunnel import Tunnel, TunnelConfig

    standin = StandinState(tmp_path / "cloudflared")
    with Tunnel(TunnelConfig(crafter_server.url, start_timeout_s=10, verify_timeout_s=10),
                api_key=api_key, command=COMMAND, env=standin.env("ok"),
                resolve=standin.resolve) as tunnel:
        public = standin.resolve(tunnel.url)
        resp = play(public, api_key, 3, mock_policy.url + "/v1", max_turns=3)
    assert resp.status_code == 200, resp.text
    assert resp.json()["metrics"]["details"]["turns"] == 3


WOOD_ACTIONS = [c["tool_calls"][0]["function"]["arguments"] for c in WOOD_SCRIPT]
WOOD_REWARDS = [("achievement_delta", 0.0), ("achievement_delta", 1.0),
                ("unique_achievement_delta", 1.0), ("achievement_delta", 1.0),
                ("achievement_delta", 1.0), ("unique_achievement_delta", 1.0)]


def play_wood_over_openenv(env, episode_id: str) -> list[dict]:
    """The wood script, one `interact` action a step, with one refused action on the way."""
    first = env.reset(seed=0, episode_id=episode_id, max_turns=4)
    assert first["reward"] == 0.0 and not first["done"]  # a reset scores 0.0, as OpenEnv says
    assert first["observation"]["text"].startswith("Turn 1 of 4 (step 0).")
    results = []
    for arguments in WOOD_ACTIONS:
        results.append(env.step(json.loads(arguments)))
        if len(results) == 1:
            with pytest.raises((ServerError, httpx.HTTPStatusError)):
                env.step({"actions": ["jump"]})  # refused: the world is unchanged
    return results


def test_openenv_clients_play_crafter_over_websocket_and_http_each_traced(
        serve, api_key, tmp_path):
    """Crafter on OpenEnv's wire: the world the trainer's /rollout plays, stepped by a client;
    the same seed and actions earn the same rewards by either transport."""
    with open_trace_store(str(tmp_path / "traces.db")) as store:
        server = serve(create_app(load_app("crafter").build_config(), api_keys=[api_key],
                                  trace_store=store))
        headers = {"X-API-Key": api_key}
        with WSEnvClient(server.url + "/openenv", headers=headers, timeout=60) as env:
            over_ws = play_wood_over_openenv(env, "wood-ws")
            state = env.state()
        with HTTPEnvClient(server.url + "/openenv", headers=headers, timeout=60) as env:
            over_http = play_wood_over_openenv(env, "wood-http")
        assert over_ws == over_http
        assert [r["reward"] for r in over_ws] == [0.0, 1.0, 1.0, 1.0]
        assert [r["done"] for r in over_ws] == [False, False, False, True]
        assert over_ws[1]["observation"]["text"].startswith("Turn 3 of 4 (step 6).")
        assert state["achievements"] == ["collect_wood", "place_table"]
        assert state["episode_id"] == "wood-ws" and state["step_count"] == 4
        deadline = time.monotonic() + 10
        while store.count_sessions(app="crafter") < 2:
            assert time.monotonic() < deadline, "the episodes were not traced"
            time.sleep(0.05)
        for summary in store.list_sessions(app="crafter"):
            episode = store.get_session(summary.session_id)
            assert episode.metadata["status"] == "ok", episode.metadata
            assert episode.metadata["transport"] == {"wood-ws": "openenv-ws",
                                                     "wood-http": "openenv-http"}[
                summary.run_id]
            assert [(r.reward_type, r.reward_value) for r in episode.event_rewards] == \
                WOOD_REWARDS
            assert episode.outcome_rewards[-1].total_reward == 2.0
            assert [t.step_metadata for t in episode.timesteps] == [
                {"difficulty": "easy", "seed": 0}] * 4
