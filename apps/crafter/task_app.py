"""Crafter: a seeded open-world survival game, played by a policy through tool calls.

Each seed is a world (`crafter_world`). An episode runs up to ``max_turns`` turns; each turn
the policy sees the world as text (and, if asked, as a PNG frame) and calls the ``interact``
tool with up to ``max_actions_per_turn`` of Crafter's 17 actions (`crafter_prompt`). A reply
without a valid call gets one corrective message, then the turn is a no-op. Death ends the
episode early. Rewards, as synth-ai's ``grpo-crafter`` gives them:

- event reward ``achievement_delta`` every turn: achievements its actions earned, repeats
  included; ``unique_achievement_delta`` on turns that unlock achievements for the first time;
- outcome reward: the number of unique achievements unlocked (``details.achievement_share``
  is its share of the 22); ``outcome_score`` and ``events_score`` follow the rubrics below.

``env.config``: ``max_turns`` (default 40), ``max_actions_per_turn`` (5), ``difficulty``
(easy | normal | hard; default: seed % 3), ``history_turns`` (earlier turns the policy is
shown, 3), ``image_observation`` (false) and ``image_size`` (pixels a side, 128).

The world is a declared environment (`CrafterEnvironment`): the kit runs the turns of
``/rollout`` from it and serves it on OpenEnv's wire at ``/openenv``. Serve it with
``synth-deploy serve crafter``; deploy it with ``synth-deploy deploy crafter``
or plain ``modal deploy apps/crafter/task_app.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from crafter_prompt import (
    NO_CALL,
    NOOP,
    interact_tool,
    observation_text,
    read_actions,
    result_text,
    system_prompt,
)
from crafter_world import ACHIEVEMENTS, MAX_SEED, TIERS, Episode, tier_of_seed

from synth_deploy.modal import ModalSettings, modal_app
from synth_deploy.taskapp import (
    BadRequest,
    LimitsInfo,
    Outcome,
    Reward,
    RolloutStep,
    RubricBundle,
    RubricCriterion,
    RubricSection,
    Step,
    TaskApp,
    TaskDataset,
    TaskInfo,
    image_part,
    png_data_url,
    text_part,
    worker_object,
)

TRAIN_SEEDS = range(0, 1_000_000)
TEST_SEEDS = range(1_000_000, 1_001_000)

# -- what this app is, what it offers, how it is judged and where it runs ---------------------

task_app = TaskApp(
    "crafter",
    name="Crafter",
    description="Survive and unlock achievements in a seeded Crafter world, by tool calls.",
    datasets=[TaskDataset(
        id="crafter-classic-v1", display_name="Crafter worlds", version="1",
        description="Seeded Crafter 1.8.3 worlds in three tiers (seed % 3): easy (32×32), "
                    "normal (64×64, Crafter's standard), hard (64×64, starting hurt, hungry "
                    "and thirsty).",
        splits=("train", "test"), default_split="train",
        default_seeds={"train": list(range(0, 60)), "test": list(TEST_SEEDS[:30])},
        seeds=range(0, MAX_SEED + 1),
        split_seeds={"train": TRAIN_SEEDS, "test": TEST_SEEDS},  # as `taskset` describes them
        metadata={"tiers": {name: tier.description for name, tier in TIERS.items()},
                  "achievements": list(ACHIEVEMENTS)})],
    rubrics=RubricBundle(
        outcome=RubricSection(name="achievements", criteria=[
            RubricCriterion(id="unique_achievements", weight=1.0,
                            description="Share of Crafter's 22 achievements unlocked in the "
                                        "episode (the outcome reward is their number)."),
            RubricCriterion(id="survival", weight=0.25,
                            description="Alive at the end with vitals kept up: mean of health, "
                                        "food, drink and energy over 9; 0 after death.")]),
        events=RubricSection(name="progress", criteria=[
            RubricCriterion(id="achievement_delta", weight=1.0,
                            description="Each turn: achievements its actions earned, repeats "
                                        "included (scored: share of turns that earned any)."),
            RubricCriterion(id="unique_achievement_delta", weight=1.0,
                            description="Each turn: achievements unlocked for the first time "
                                        "(scored: share of turns that unlocked one).")])),
    limits=LimitsInfo(max_turns=40, max_response_tokens=512, timeout_seconds=600),
    modal=ModalSettings(
        name="synth-crafter", python_version="3.11", pip_packages=["crafter"],
        memory=1024, cpu=2.0, timeout=900, max_containers=20,
        concurrent_inputs=16,  # rollouts wait on the policy; steps run one at a time
    ),
)


@dataclass(frozen=True)
class EpisodeSettings:
    """``env.config`` of a rollout request, checked."""

    max_turns: int = 40
    max_actions: int = 5
    history_turns: int = 3
    image: bool = False
    image_size: int = 128
    difficulty: str | None = None

    @classmethod
    def from_config(cls, config: dict) -> EpisodeSettings:
        def number(name: str, default: int, low: int, high: int) -> int:
            value = config.get(name, default)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise BadRequest(f"{name} must be an integer from {low} to {high}, got "
                                 f"{value!r}", field=f"env.config.{name}")
            return value

        difficulty = config.get("difficulty")
        if difficulty is not None and difficulty not in TIERS:
            raise BadRequest(f"difficulty must be one of {', '.join(TIERS)}, got {difficulty!r}",
                             field="env.config.difficulty")
        image = config.get("image_observation", False)
        if not isinstance(image, bool):
            raise BadRequest(f"image_observation must be true or false, got {image!r}",
                             field="env.config.image_observation")
        return cls(max_turns=number("max_turns", 40, 1, 500),
                   max_actions=number("max_actions_per_turn", 5, 1, 16),
                   history_turns=number("history_turns", 3, 0, 50), image=image,
                   image_size=number("image_size", 128, 16, 1024), difficulty=difficulty)


# -- seeds -> task instances --------------------------------------------------------------------

@task_app.instances
def instances(seeds: Sequence[int]) -> list[TaskInfo]:
    result = []
    for seed in seeds:
        tier = tier_of_seed(seed)
        split = "test" if seed in TEST_SEEDS else "train"
        info = task_app.instance(seed, difficulty=tier.name, split=split,
                                 world_size=list(tier.area), start=dict(tier.start),
                                 tier=tier.description)
        info.dataset.default_split = split
        result.append(info)
    return result


@task_app.taskset
def taskset() -> dict:
    return {"id": task_app.app_id, "name": task_app.name, "tiers": list(TIERS),
            "actions": "Crafter's 17, through the interact tool",
            "achievements": list(ACHIEVEMENTS),
            "splits": {"train": [TRAIN_SEEDS.start, TRAIN_SEEDS.stop - 1],
                       "test": [TEST_SEEDS.start, TEST_SEEDS.stop - 1]}}


# -- one episode: the world, in a worker process ---------------------------------------------

@task_app.environment
class CrafterEnvironment:
    """A seeded world a policy plays by `interact` calls; the kit runs the turns (`/rollout`,
    and OpenEnv's wire at /openenv)."""

    no_call_message = NO_CALL
    noop = {"actions": list(NOOP)}

    def __init__(self) -> None:
        self.settings, self.world, self.view = EpisodeSettings(), None, None

    def tool(self) -> dict:
        return interact_tool(self.settings.max_actions)

    def system_prompt(self) -> str:
        return system_prompt(self.settings.max_turns, self.settings.max_actions)

    async def reset(self, seed, *, episode_id, config) -> dict:
        self.settings = settings = EpisodeSettings.from_config(config)
        self.seed = seed if seed is not None else _seed_of(episode_id)
        self.tier = TIERS[settings.difficulty] if settings.difficulty else tier_of_seed(self.seed)
        self.history_turns, self.turn, self.last = settings.history_turns, 0, None
        self.timestep_metadata = {"difficulty": self.tier.name, "seed": self.seed}
        await self.close()
        # The world lives in a worker process: generating it (~1.5 s of CPU for 64×64) and
        # stepping it never hold up the server. Episodes of one seed share a process and its
        # kept worlds.
        self.world = contextlib.AsyncExitStack()
        self.episode = await self.world.enter_async_context(worker_object(
            Episode, self.seed, self.tier, affinity=(self.seed, self.tier.name)))
        self.view, png = await self.episode.observe(self._image_size)
        return self._observation(self.view, png)

    async def step(self, action: dict) -> Step:
        actions, note = read_actions(action, self.settings.max_actions)
        result = await self.episode.play(actions, self._image_size)
        self.turn, self.last, self.view = self.turn + 1, result, result.view
        truncated = self.turn == self.settings.max_turns and not result.died
        rewards = [Reward("achievement_delta", result.achievement_delta,
                          {"achievements": result.gained})]
        if result.new_unique:
            rewards.append(Reward("unique_achievement_delta", len(result.new_unique),
                                  {"achievements": list(result.new_unique)}))
        return Step(
            self._observation(result.view, result.png), reward=float(result.achievement_delta),
            done=result.died or truncated, truncated=truncated, rewards=rewards,
            message=result_text(result, note), state=self.state(),
            info={"actions": list(result.actions), "gained": result.gained,
                  "new_achievements": list(result.new_unique)})

    def prompt(self, observation: dict):
        image = observation.get("image")
        return [text_part(observation["text"]), image_part(image)] if image else \
            observation["text"]

    def state(self) -> dict:
        view = self.view
        return {"vitals": view.vitals, "inventory": view.inventory,
                "achievements": list(view.achievements), "step": view.step} if view else {}

    def outcome(self, steps: list[RolloutStep]) -> Outcome:
        last, tier = self.last, self.tier.name
        unlocked = list(last.view.achievements)
        share = len(unlocked) / len(ACHIEVEMENTS)
        vitals = last.view.vitals
        survival = 0.0 if last.died else sum(vitals.values()) / (9 * len(vitals))
        turns = len(steps)
        events = {"achievement_delta": sum(s.reward > 0 for s in steps) / turns,
                  "unique_achievement_delta": sum(bool(s.info["new_achievements"])
                                                  for s in steps) / turns}
        rubric = task_app.rubrics
        details = {
            "difficulty": tier, "achievements": len(unlocked), "turns": turns,
            "unlocked": unlocked, "achievement_share": round(share, 4), "died": last.died,
            "env_steps": last.view.step,
            "valid_first_replies": sum(not s.info.get("reply_problem") for s in steps),
            "rubric": {"outcome": {"unique_achievements": share,
                                   "survival": round(survival, 4)}, "events": events},
        }
        # The one place the reward is stated: the kit fills every metric spelling from it.
        return Outcome(
            reward=float(len(unlocked)), achievements=len(unlocked),
            metadata={"achievements": unlocked, "difficulty": tier, "died": last.died,
                      "achievement_share": share},
            metrics={"outcome_score": _weighted(rubric.outcome, {
                "unique_achievements": share, "survival": survival}),
                "events_score": _weighted(rubric.events, events), "details": details},
            final={"achievements": unlocked, "reward": float(len(unlocked)),
                   "died": last.died},
            env_id=f"crafter:{self.seed}:{tier}")

    async def close(self) -> None:
        if self.world is not None:
            world, self.world = self.world, None
            await world.aclose()

    @property
    def _image_size(self) -> int | None:
        return self.settings.image_size if self.settings.image else None

    def _observation(self, view, png: bytes | None) -> dict:
        turn = min(self.turn + 1, self.settings.max_turns)
        text = observation_text(view, turn, self.settings.max_turns)
        return {"text": text, "image": png_data_url(png)} if png else {"text": text}


def _seed_of(run_id: str) -> int:
    """A request without a seed plays the world its run id names (as synth-ai's apps do)."""
    return int(hashlib.sha256(run_id.encode()).hexdigest()[:8], 16) % (MAX_SEED + 1)


def _weighted(section: RubricSection | None, scores: dict[str, float]) -> float:
    criteria = section.criteria if section else []
    total = sum(c.weight or 0.0 for c in criteria)
    return round(sum((c.weight or 0.0) * scores[c.id] for c in criteria) / total, 6) \
        if total else 0.0


app = modal_app(__file__)  # `modal deploy apps/crafter/task_app.py` deploys this
