"""The policy's side of Crafter: the `interact` tool, observations as text, reading replies.

A turn's observation is text a language model can act on: vitals, inventory, achievements,
what the player faces, the nearest thing of each kind with its direction, and the local view
as a 9×7 grid of symbols with a legend. The game's rules in the system prompt are generated
from Crafter's own tables, so they cannot drift from the game.

A reply is valid when it calls `interact` with 1..N action names. Anything else gets one
corrective message (a tool error for a broken call, a user message for a reply without one);
the turn after a second miss is a no-op.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import crafter.constants as rules
from crafter_world import ACHIEVEMENTS, ACTIONS, VIEW_SIZE, TurnResult, View

from synth_deploy.taskapp import ToolCall, function_tool, tool_message

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


@dataclass(frozen=True)
class Decision:
    """What a reply asks for: the actions of its first valid `interact` call, if any."""

    calls: tuple[ToolCall, ...]
    actions: tuple[str, ...] = ()
    executed: ToolCall | None = None
    problems: dict[str, str] | None = None  # call id -> why it is not executed
    note: str | None = None  # e.g. actions beyond the limit were dropped

    @property
    def valid(self) -> bool:
        return self.executed is not None

    @property
    def problem(self) -> str:
        """One line saying why nothing runs (for the trace)."""
        if not self.calls:
            return "no tool call"
        return "; ".join(self.problems.values()) if self.problems else ""

    def corrections(self) -> list[dict]:
        """The one corrective message(s) for an invalid reply: a tool error answering each
        call, or, for a reply without calls, a user message."""
        if not self.calls:
            return [{"role": "user", "content": NO_CALL}]
        return [tool_message(c.id, f"error: {self.problems[c.id]}") for c in self.calls]

    def answers(self, result: TurnResult | None) -> list[dict]:
        """Tool messages answering every call of the reply, once the turn has run."""
        out = []
        for call in self.calls:
            if call is self.executed and result is not None:
                out.append(tool_message(call.id, result_text(result, self.note)))
            else:
                out.append(tool_message(call.id, f"error: {self.problems[call.id]}"))
        return out


def decide(calls: Sequence[ToolCall], max_actions: int) -> Decision:
    """Read a reply's tool calls: the first valid `interact` call runs, the others do not."""
    problems: dict[str, str] = {}
    executed, actions, note = None, (), None
    for call in calls:
        if executed is not None:
            problems[call.id] = f"not executed: one {TOOL_NAME} call per turn"
            continue
        why, names = _check(call)
        if why:
            problems[call.id] = why
            continue
        executed, actions = call, names[:max_actions]
        if len(names) > max_actions:
            note = f"only the first {max_actions} of {len(names)} actions were taken"
    return Decision(tuple(calls), actions, executed, problems, note)


def _check(call: ToolCall) -> tuple[str | None, tuple[str, ...]]:
    if call.name != TOOL_NAME:
        return f"unknown tool {call.name!r}; the only tool is {TOOL_NAME}", ()
    if call.arguments is None:
        return call.error or "arguments could not be read", ()
    raw = call.arguments.get("actions")
    if not isinstance(raw, list) or not raw:
        return ('arguments must be {"actions": [...]} with at least one action name, got '
                f"{call.raw_arguments[:120]}"), ()
    names = [a.strip().lower().replace(" ", "_").replace("-", "_") if isinstance(a, str)
             else a for a in raw]
    unknown = [repr(a) for a in names if a not in ACTIONS]
    if unknown:
        return (f"unknown action(s) {', '.join(unknown[:5])}; valid actions: "
                f"{', '.join(ACTIONS)}"), ()
    return None, tuple(names)


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


__all__ = ["NOOP", "NO_CALL", "SYMBOLS", "TOOL_NAME", "Decision", "decide", "interact_tool",
           "observation_text", "result_text", "system_prompt"]
