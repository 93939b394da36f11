"""Seeded Crafter worlds (crafter 1.8.3): difficulty tiers, a turn of actions, achievements.

A seed and a tier fully determine a world, its first observation and, given the same
actions, every step after: Crafter draws everything from one generator seeded at reset. A
64×64 world takes about 1.5 s of pure Python to generate, so generated worlds are kept
(`WORLD_CACHE_SIZE` of them) and each episode plays on a copy: a trainer's group of rollouts
on one seed generates it once.

Nothing here knows about policies or prompts; `crafter_prompt` turns a `View` into text.
"""

from __future__ import annotations

import copy
import io
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

try:
    import crafter
    import crafter.constants
    import crafter.objects
    from PIL import Image
except ImportError as exc:  # the app's one dependency beyond the kit
    raise ImportError(f"the crafter task app needs the crafter package ({exc}): "
                      "pip install 'synth-deploy[crafter]' (or pip install crafter)") from exc

ACTIONS: tuple[str, ...] = tuple(crafter.constants.actions)  # the 17, as Crafter names them
ACHIEVEMENTS: tuple[str, ...] = tuple(crafter.constants.achievements)  # the 22
VITALS = ("health", "food", "drink", "energy")
VIEW_SIZE = (9, 7)  # the cells the player sees (Crafter's local view: 9×9 minus the item rows)
WORLD_CACHE_SIZE = 32
MAX_SEED = 2**31 - 2

_ACTION_INDEX = {name: i for i, name in enumerate(ACTIONS)}
_OBJECT_NAMES = {crafter.objects.Player: "you", crafter.objects.Cow: "cow",
                 crafter.objects.Zombie: "zombie", crafter.objects.Skeleton: "skeleton",
                 crafter.objects.Arrow: "arrow"}
DIRECTIONS = {(-1, 0): "left", (1, 0): "right", (0, -1): "up", (0, 1): "down"}


@dataclass(frozen=True)
class Tier:
    """A difficulty tier: the world's size and the player's starting state."""

    name: str
    area: tuple[int, int]
    start: Mapping[str, int] = field(default_factory=dict)  # inventory at the first step
    description: str = ""


TIERS: dict[str, Tier] = {t.name: t for t in (
    Tier("easy", (32, 32), {}, "a 32×32 world: stone, coal and water are a few steps away"),
    Tier("normal", (64, 64), {}, "Crafter's standard 64×64 world and start"),
    Tier("hard", (64, 64), {"health": 5, "food": 2, "drink": 2},
         "a 64×64 world, starting hurt, hungry and thirsty: find food and water or die"),
)}
TIER_ORDER = tuple(TIERS)


def tier_of_seed(seed: int) -> Tier:
    """The tier a seed plays at unless the request names one: seed % 3 picks it."""
    return TIERS[TIER_ORDER[seed % len(TIER_ORDER)]]


def check_seed(seed: int) -> int:
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
        raise LookupError(f"crafter seeds are integers from 0 to {MAX_SEED}, got {seed!r}")
    return seed


@dataclass(frozen=True)
class View:
    """What the player perceives after a step: the local view and its own state."""

    grid: tuple[tuple[str, ...], ...]  # VIEW_SIZE cells, top row first; "you" in the middle
    facing: str  # left/right/up/down
    facing_cell: str  # what a `do` would act on
    nearby: tuple[tuple[str, int, int], ...]  # (thing, dx, dy): the nearest of each kind
    vitals: dict[str, int]
    inventory: dict[str, int]  # items held (vitals apart), only those above zero
    achievements: tuple[str, ...]  # unlocked so far, in unlock order
    daylight: float
    sleeping: bool
    step: int


@dataclass(frozen=True)
class TurnResult:
    """One turn: the actions taken, what they earned, and what the player sees after it."""

    actions: tuple[str, ...]
    gained: dict[str, int]  # achievement -> times earned this turn (repeats count)
    new_unique: tuple[str, ...]  # achievements unlocked for the first time this episode
    died: bool
    view: View
    png: bytes | None = None  # the frame, when asked for

    @property
    def achievement_delta(self) -> int:
        return sum(self.gained.values())


class Episode:
    """One seeded Crafter episode, played a turn (a few actions) at a time."""

    def __init__(self, seed: int, tier: Tier) -> None:
        self.seed, self.tier = check_seed(seed), tier
        self.env, self.frame = _fresh_world(seed, tier)
        self.unlocked: list[str] = []
        self.steps = 0

    @property
    def player(self):
        return self.env._player

    @property
    def dead(self) -> bool:
        return self.player.health <= 0

    def observe(self, image_size: int | None = None) -> tuple[View, bytes | None]:
        """What the player sees now, and the frame as PNG when ``image_size`` is given."""
        return self.view(), self.png(image_size) if image_size else None

    def play(self, actions: Sequence[str], image_size: int | None = None) -> TurnResult:
        """Take ``actions`` in order (names from `ACTIONS`), stopping at death; the frame
        after them comes as PNG when ``image_size`` is given."""
        before = dict(self.player.achievements)
        taken = []
        for name in actions:
            if self.dead:
                break
            self.frame, _reward, _done, _info = self.env.step(_ACTION_INDEX[name])
            self.steps += 1
            taken.append(name)
        after = self.player.achievements
        gained = {k: after[k] - before[k] for k in ACHIEVEMENTS if after[k] > before[k]}
        new = tuple(k for k in ACHIEVEMENTS if after[k] > 0 and k not in self.unlocked)
        self.unlocked += new
        return TurnResult(tuple(taken), gained, new, self.dead, self.view(),
                          self.png(image_size) if image_size else None)

    def view(self) -> View:
        world, player = self.env._world, self.player
        px, py = (int(v) for v in player.pos)
        width, height = VIEW_SIZE
        grid, seen = [], {}
        for dy in range(-(height // 2), height // 2 + 1):
            row = []
            for dx in range(-(width // 2), width // 2 + 1):
                name = _cell(world, px + dx, py + dy)
                row.append(name)
                if name not in ("you", "grass", "sand", "path", "unknown") and (
                        name not in seen or abs(dx) + abs(dy) < sum(map(abs, seen[name]))):
                    seen[name] = (dx, dy)
            grid.append(tuple(row))
        fx, fy = (int(v) for v in player.facing)
        nearby = sorted(((n, dx, dy) for n, (dx, dy) in seen.items()),
                        key=lambda item: (abs(item[1]) + abs(item[2]), item[0]))
        inventory = dict(player.inventory)
        return View(
            grid=tuple(grid), facing=DIRECTIONS[(fx, fy)], facing_cell=_cell(world, px + fx,
                                                                               py + fy),
            nearby=tuple(nearby), vitals={k: int(inventory[k]) for k in VITALS},
            inventory={k: int(v) for k, v in inventory.items() if k not in VITALS and v > 0},
            achievements=tuple(self.unlocked), daylight=float(world.daylight),
            sleeping=bool(player.sleeping), step=self.steps)

    def png(self, size: int | None = None) -> bytes:
        """The current frame as PNG, scaled to ``size`` pixels a side (nearest neighbour, so
        the world's dynamics never depend on it)."""
        image = Image.fromarray(self.frame)
        if size and size != image.width:
            image = image.resize((size, size), Image.NEAREST)
        out = io.BytesIO()
        image.save(out, format="PNG", optimize=False)
        return out.getvalue()


def _cell(world, x: int, y: int) -> str:
    material, obj = world[(x, y)]
    if material is None:
        return "unknown"  # beyond the world's edge
    if obj is not None:
        if isinstance(obj, crafter.objects.Plant):
            return "ripe plant" if obj.ripe else "sapling"
        return _OBJECT_NAMES.get(type(obj), type(obj).__name__.lower())
    return material


# -- generated worlds, kept per (seed, tier) -----------------------------------------------------

_worlds: OrderedDict[tuple[int, str], tuple[object, object]] = OrderedDict()
_worlds_lock = threading.Lock()


def _fresh_world(seed: int, tier: Tier) -> tuple[object, object]:
    """A new copy of the world for (seed, tier) just after reset, and its first frame."""
    key = (seed, tier.name)
    with _worlds_lock:
        pristine = _worlds.get(key)
        if pristine is not None:
            _worlds.move_to_end(key)
    if pristine is None:
        pristine = _generate(seed, tier)
        with _worlds_lock:
            _worlds[key] = pristine
            while len(_worlds) > WORLD_CACHE_SIZE:
                _worlds.popitem(last=False)
    env, frame = pristine
    # The textures are read-only and large: shared, not copied.
    return copy.deepcopy(env, {id(env._textures): env._textures}), frame


class _SeededEnv(crafter.Env):
    """Crafter, deterministic for a seed over a whole episode.

    Crafter keeps each chunk's objects in a set, which iterates in memory-address order: which
    creature despawns then differs between two runs of one seed (two fresh 32×32 worlds of
    seed 1 part ways at step 127 under the same actions). Handed over sorted by position
    (unique per object), the choice is the same every run.
    """

    def _balance_chunk(self, chunk, objs):
        super()._balance_chunk(chunk, sorted(objs, key=lambda o: (int(o.pos[0]),
                                                                  int(o.pos[1]))))


def _generate(seed: int, tier: Tier) -> tuple[object, object]:
    env = _SeededEnv(area=tier.area, seed=seed)
    frame = env.reset()
    if tier.start:
        player = env._player
        for item, amount in tier.start.items():
            player.inventory[item] = amount
        player._last_health = env._last_health = player.health
        # At step 0 it is day: rendering draws nothing from the world's generator.
        frame = env.render()
    return env, frame


__all__ = ["ACHIEVEMENTS", "ACTIONS", "DIRECTIONS", "TIERS", "VIEW_SIZE", "VITALS", "Episode",
           "Tier", "TurnResult", "View", "check_seed", "tier_of_seed"]
