"""The policy's side of Crafter: the `interact` tool, observations as text, reading replies.

A turn's observation is text a language model can act on: vitals, inventory, achievements,
what the player faces, the nearest thing of each kind with its direction, and the local view
as a 9×7 grid of symbols with a legend. The game's rules in the system prompt are generated
from Crafter's own tables, so they cannot drift from the game.

A reply is valid when it calls `interact` with 1..N action names (`read_actions`; the kit's
episode loop reads the calls). Anything else gets one corrective message (a tool error for a
broken call, `NO_CALL` for a reply without one); the turn after a second miss is a no-op.
"""

from __future__ import annotations

import json

import crafter.constants as rules
from crafter_world import ACHIEVEMENTS, ACTIONS, VIEW_SIZE, TurnResult, View

from synth_deploy.taskapp import InvalidAction, function_tool

TOOL_NAME = "interact"
NOOP = ("noop",)

SYMBOLS = {
    "grass": ".", "sand": ":", "path": "_", "water": "~", "lava": "%", "tree": "T",
    "stone": "#", "coal": "c", "iron": "i", "diamond": "D", "table": "t", "furnace": "f",
    "you": "@", "cow": "C", "zombie": "Z", "skeleton": "S", "arrow": "*", "sapling": "p",
    "ripe plant": "P", "unknown": "X",
}
_LEGEND_NAMES = {"unknown": "edge of the world", "you": "you"}


def interact_tool(max_actions: int) -> dict:
    """The one tool the policy is offered."""
    return function_tool(TOOL_NAME, f"Take 1 to {max_actions} Crafter actions, in order.", {
        "type": "object",
        "properties": {"actions": {
            "type": "array", "minItems": 1, "maxItems": max_actions,
            "items": {"type": "string", "enum": list(ACTIONS)},
            "description": "Action names, executed one after another."}},
        "required": ["actions"], "additionalProperties": False})


def system_prompt(max_turns: int, max_actions: int) -> str:
    collect = "; ".join(
        f"{source} -> {', '.join(info['receive'])}"
        + (f" (needs {', '.join(info['require'])})" if info["require"] else "")
        + (" (sometimes)" if info.get("probability", 1) < 1 else "")
        for source, info in rules.collect.items())
    place = "; ".join(f"place_{name}: uses {_amounts(info['uses'])}, onto "
                      f"{'/'.join(info['where'])}" for name, info in rules.place.items())
    make = "; ".join(f"make_{name}: uses {_amounts(info['uses'])}, next to "
                     f"{' and '.join(info['nearby'])}" for name, info in rules.make.items())
    return (
        "You play Crafter, a 2D survival game seen from above. Unlock as many of its 22 "
        f"achievements as you can in {max_turns} turns: {', '.join(ACHIEVEMENTS)}.\n"
        "Each turn you see your health, food, drink and energy (0-9; at 0 health you die), "
        f"your inventory, and the {VIEW_SIZE[0]}x{VIEW_SIZE[1]} cells around you.\n"
        f"Act by calling the `{TOOL_NAME}` tool with 1 to {max_actions} actions; they run in "
        "order.\n"
        "Actions: move_left/move_right/move_up/move_down step one cell, or turn you toward a "
        "cell you cannot enter; do acts on the cell you face (collect, attack, eat, drink); "
        "sleep when energy is low (waking up rested unlocks wake_up); noop waits.\n"
        f"Collect with do: {collect}. Attack zombies and skeletons with do; do on a cow "
        "(a few hits) eats it; do on a ripe plant eats it.\n"
        f"Place: {place}.\nMake: {make}.\n"
        "Food and drink fall over time: eat (cows, ripe plants) and drink (do on water).")


def _amounts(uses: dict) -> str:
    return ", ".join(f"{n} {item}" for item, n in uses.items())


def observation_text(view: View, turn: int, max_turns: int) -> str:
    vitals = " · ".join(f"{k.capitalize()} {v}/9" for k, v in view.vitals.items())
    inventory = ", ".join(f"{k} {v}" for k, v in view.inventory.items()) or "nothing"
    unlocked = ", ".join(view.achievements) or "none yet"
    nearby = "; ".join(f"{name} {_direction(dx, dy)}" for name, dx, dy in view.nearby) or \
        "only grass, sand and paths"
    rows = [" ".join(SYMBOLS.get(cell, "?") for cell in row) for row in view.grid]
    shown = sorted({cell for row in view.grid for cell in row}, key=list(SYMBOLS).index)
    legend = "  ".join(f"{SYMBOLS[c]} {_LEGEND_NAMES.get(c, c)}" for c in shown if c in SYMBOLS)
    state = []
    if view.sleeping:
        state.append("You are asleep: you wake when rested or hurt.")
    if view.daylight < 0.35:
        state.append("It is night: zombies come out on the grass.")
    return "\n".join([
        f"Turn {turn} of {max_turns} (step {view.step}).",
        vitals,
        f"Inventory: {inventory}",
        f"Achievements ({len(view.achievements)}/22): {unlocked}",
        *state,
        f"You face {view.facing}: {view.facing_cell}.",
        f"Nearest: {nearby}.",
        "Map (north up; you are @):",
        *rows,
        f"Legend: {legend}",
    ])


def _direction(dx: int, dy: int) -> str:
    parts = []
    if dx:
        parts.append(f"{abs(dx)} {'right' if dx > 0 else 'left'}")
    if dy:
        parts.append(f"{abs(dy)} {'down' if dy > 0 else 'up'}")
    return " ".join(parts) or "here"


# -- replies --------------------------------------------------------------------------------------

NO_CALL = (f"You did not call the {TOOL_NAME} tool. Reply with a call like "
           f'{TOOL_NAME}({{"actions": ["move_left", "do"]}}); valid actions: '
           f"{', '.join(ACTIONS)}.")


def read_actions(arguments: dict, max_actions: int) -> tuple[tuple[str, ...], str | None]:
    """The action names an `interact` call asks for (at most ``max_actions``; the note says
    when more were dropped), or `InvalidAction` saying what is wrong with its arguments."""
    raw = arguments.get("actions")
    if not isinstance(raw, list) or not raw:
        raise InvalidAction('arguments must be {"actions": [...]} with at least one action '
                            f"name, got {json.dumps(arguments)[:120]}")
    names = [a.strip().lower().replace(" ", "_").replace("-", "_") if isinstance(a, str)
             else a for a in raw]
    unknown = [repr(a) for a in names if a not in ACTIONS]
    if unknown:
        raise InvalidAction(f"unknown action(s) {', '.join(unknown[:5])}; valid actions: "
                            f"{', '.join(ACTIONS)}")
    note = (f"only the first {max_actions} of {len(names)} actions were taken"
            if len(names) > max_actions else None)
    return tuple(names[:max_actions]), note


def result_text(result: TurnResult, note: str | None = None) -> str:
    parts = [f"Took {', '.join(result.actions) or 'no action'}."]
    if note:
        parts.append(f"({note})")
    if result.gained:
        parts.append("Earned: " + ", ".join(
            name + (" (new!)" if name in result.new_unique else "")
            for name in result.gained) + ".")
    if result.died:
        parts.append("You died.")
    return " ".join(parts)


__all__ = ["NOOP", "NO_CALL", "SYMBOLS", "TOOL_NAME", "interact_tool", "observation_text",
           "read_actions", "result_text", "system_prompt"]
