"""The crafter app's world and policy interface, without a server: seeded determinism, tiers,
achievement accounting, the text observation, and reading tool-call replies."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

CRAFTER_DIR = Path(__file__).resolve().parents[2] / "apps" / "crafter"
sys.path.insert(0, str(CRAFTER_DIR))
from crafter_prompt import (  # noqa: E402
    NO_CALL,
    interact_tool,
    observation_text,
    read_actions,
    result_text,
    system_prompt,
)
from crafter_world import (  # noqa: E402
    ACHIEVEMENTS,
    ACTIONS,
    TIERS,
    Episode,
    check_seed,
    tier_of_seed,
)

from synth_deploy.taskapp import InvalidAction, ToolCall  # noqa: E402
from synth_deploy.taskapp.tools import parse_tool_calls  # noqa: E402

EASY = TIERS["easy"]
# Seed 0 (easy): a tree 4 left and 1 up, another 2 left and 1 up of the first.
WOOD_SCRIPT = (("move_up", "move_left", "move_left", "move_left", "move_left"), ("do",),
               ("move_up", "move_left", "move_left", "do"), ("move_right", "place_table"))
# 300 actions: past step 127, where two fresh Crafter worlds of one seed used to part ways.
LONG_PLAY = [ACTIONS[(i * 7 + i // 5) % len(ACTIONS)] for i in range(300)]

DIGEST = f"""
import hashlib, json, sys
sys.path.insert(0, {str(CRAFTER_DIR)!r})
from crafter_world import TIERS, Episode
actions = json.loads(sys.argv[1])
episode = Episode(int(sys.argv[2]), TIERS[sys.argv[3]])
digest = hashlib.sha256(episode.frame.tobytes())
for i in range(0, len(actions), 4):
    result = episode.play(actions[i:i + 4])
    digest.update(episode.frame.tobytes() + repr(result.view).encode())
print(digest.hexdigest())
"""


def digest_of(seed: int, tier: str, actions: list[str]) -> str:
    episode = Episode(seed, TIERS[tier])
    digest = hashlib.sha256(episode.frame.tobytes())
    for i in range(0, len(actions), 4):
        result = episode.play(actions[i:i + 4])
        digest.update(episode.frame.tobytes() + repr(result.view).encode())
    return digest.hexdigest()


def test_a_seed_is_one_world_with_one_first_observation():
    a, b, other = Episode(0, EASY), Episode(0, EASY), Episode(3, EASY)
    assert (a.frame == b.frame).all() and a.view() == b.view()
    assert observation_text(a.view(), 1, 40) == observation_text(b.view(), 1, 40)
    assert a.png() == b.png()
    assert a.view().grid != other.view().grid


def test_the_same_actions_replay_the_same_episode_in_another_process():
    here = digest_of(0, "easy", LONG_PLAY)
    assert digest_of(0, "easy", LONG_PLAY) == here  # a copy of the kept world
    child = subprocess.run([sys.executable, "-c", DIGEST, json.dumps(LONG_PLAY), "0", "easy"],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == here  # generated afresh, objects at other addresses
    assert digest_of(0, "easy", list(reversed(LONG_PLAY))) != here


def test_tiers_follow_the_seed_and_set_the_start():
    assert [tier_of_seed(s).name for s in range(6)] == ["easy", "normal", "hard"] * 2
    assert TIERS["easy"].area == (32, 32) and TIERS["normal"].area == (64, 64)
    assert Episode(0, EASY).env._world.area == (32, 32)
    assert Episode(2, TIERS["hard"]).view().vitals == {"health": 5, "food": 2, "drink": 2,
                                                        "energy": 9}
    assert len(ACTIONS) == 17 and len(ACHIEVEMENTS) == 22
    for bad in (-1, 2**31, "3", True):
        with pytest.raises(LookupError):
            check_seed(bad)


def test_a_scripted_game_earns_exactly_its_achievements():
    episode = Episode(0, EASY)
    results = [episode.play(actions) for actions in WOOD_SCRIPT]
    assert [r.gained for r in results] == [{}, {"collect_wood": 1}, {"collect_wood": 1},
                                           {"place_table": 1}]
    assert [r.achievement_delta for r in results] == [0, 1, 1, 1]
    assert [r.new_unique for r in results] == [(), ("collect_wood",), (), ("place_table",)]
    assert episode.unlocked == ["collect_wood", "place_table"]
    assert results[-1].view.inventory == {} and episode.steps == 12


def test_death_stops_the_turn():
    episode = Episode(0, EASY)
    episode.player.health = 0  # as lava or a zombie would leave it
    result = episode.play(["noop", "noop"])
    assert result.died and result.actions == ()


def test_the_observation_reads_like_the_frame():
    text = observation_text(Episode(0, EASY).view(), 1, 40)
    lines = text.splitlines()
    assert lines[0] == "Turn 1 of 40 (step 0)."
    assert "Health 9/9 · Food 9/9 · Drink 9/9 · Energy 9/9" in lines
    assert "Nearest: tree 4 left 1 up." in lines
    grid = lines[lines.index("Map (north up; you are @):") + 1:][:7]
    assert [len(row.split()) for row in grid] == [9] * 7
    assert grid[3].split()[4] == "@" and grid[2].split()[0] == "T"
    assert lines[-1] == "Legend: . grass  T tree  @ you"


def test_the_rules_in_the_prompt_come_from_crafters_tables():
    prompt = system_prompt(40, 5)
    assert "place_table: uses 2 wood" in prompt
    assert "make_iron_pickaxe: uses 1 wood, 1 coal, 1 iron, next to table and furnace" in prompt
    assert all(name in prompt for name in ACHIEVEMENTS)
    tool = interact_tool(5)["function"]
    assert tool["name"] == "interact"
    assert tool["parameters"]["properties"]["actions"]["items"]["enum"] == list(ACTIONS)
    assert tool["parameters"]["properties"]["actions"]["maxItems"] == 5


def call(arguments, name="interact", call_id="c1"):
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": raw}}


# Which call of a reply runs, and what answers the others, is the kit's episode loop
# (tests/serving/test_openenv_wire.py); what an `interact` call's arguments ask for is the app's.

def test_a_valid_call_runs_its_actions():
    assert read_actions({"actions": ["move_left", " DO "]}, 5) == (("move_left", "do"), None)


@pytest.mark.parametrize(("arguments", "problem"), [
    ({"actions": ["jump", "do"]}, "unknown action(s) 'jump'; valid actions: noop,"),
    ({"actions": []}, 'arguments must be {"actions": [...]}'),
    ({"moves": ["do"]}, 'arguments must be {"actions": [...]}'),
])
def test_a_broken_call_is_refused_with_what_is_wrong(arguments, problem):
    with pytest.raises(InvalidAction) as refused:
        read_actions(arguments, 5)
    assert refused.value.message.startswith(problem)


def test_actions_beyond_the_limit_are_dropped_with_a_note():
    actions, note = read_actions({"actions": ["do"] * 7}, 5)
    assert actions == ("do",) * 5 and note == "only the first 5 of 7 actions were taken"
    result = Episode(0, EASY).play(actions)
    assert result_text(result, note).startswith("Took do, do, do, do, do. (only the first 5")
    assert "interact" in NO_CALL and "move_left" in NO_CALL


def test_tool_calls_are_parsed_as_far_as_they_go():
    [ok, as_object, broken, junk] = parse_tool_calls({"tool_calls": [
        call({"actions": ["do"]}), {"id": "x", "function": {"name": "interact",
                                                            "arguments": {"actions": []}}},
        call("{nope"), "not a call"]})
    assert ok == ToolCall("c1", "interact", {"actions": ["do"]}, '{"actions": ["do"]}')
    assert as_object.arguments == {"actions": []} and as_object.error is None
    assert broken.arguments is None and "not valid JSON" in broken.error
    assert junk.id == "call_3" and "not an object" in junk.error


def test_tool_call_arguments_nested_past_the_stack_are_an_error_on_that_call():
    deep = "[" * 100_000 + "]" * 100_000  # a model's text: nothing bounds it
    [nested, ok] = parse_tool_calls({"tool_calls": [call(deep), call({"actions": ["do"]})]})
    assert nested.arguments is None and nested.error == "arguments nest too deeply to decode"
    assert nested.raw_arguments == deep
    assert ok.arguments == {"actions": ["do"]}
