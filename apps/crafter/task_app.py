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

Serve it with ``synth-deploy serve crafter``; deploy it with ``synth-deploy deploy crafter``
or plain ``modal deploy apps/crafter/task_app.py``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from crafter_prompt import (
    NOOP,
    decide,
    interact_tool,
    observation_text,
    system_prompt,
)
from crafter_world import ACHIEVEMENTS, MAX_SEED, TIERS, Episode, TurnResult, tier_of_seed

from synth_deploy.modal import ModalSettings, modal_app
from synth_deploy.taskapp import (
    BadRequest,
    LimitsInfo,
    RolloutContext,
    RolloutRequest,
    RolloutStep,
    RolloutTrajectory,
    RubricBundle,
    RubricCriterion,
    RubricSection,
    TaskApp,
    TaskDataset,
    TaskInfo,
    call_policy,
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


# -- one episode --------------------------------------------------------------------------------

@task_app.rollout
async def rollout(request: RolloutRequest, ctx: RolloutContext) -> dict:
    settings = EpisodeSettings.from_config(request.env.config)
    seed = request.env.seed if request.env.seed is not None else _seed_of(request.run_id)
    tier = TIERS[settings.difficulty] if settings.difficulty else tier_of_seed(seed)
    # The world lives in a worker process: generating it (~1.5 s of CPU for 64×64) and
    # stepping it never hold up the server. Rollouts of one seed share a process and its
    # kept worlds.
    async with worker_object(Episode, seed, tier, affinity=(seed, tier.name)) as episode:
        view, png = await episode.observe(settings.image_size if settings.image else None)
        steps, last = await _play(ctx, episode, settings, view, png, seed, tier.name)
    unlocked = list(last.view.achievements)
    # The one place the reward is stated: the kit fills every metric spelling from it.
    ctx.tracer.record_outcome_reward(
        float(len(unlocked)), achievements_count=len(unlocked), total_steps=len(steps),
        metadata={"achievements": unlocked, "difficulty": tier.name, "died": last.died,
                  "achievement_share": len(unlocked) / len(ACHIEVEMENTS)})
    return _response(request, seed, tier.name, steps, last)


async def _play(ctx: RolloutContext, episode, settings: EpisodeSettings, view, png,
                seed: int, tier: str) -> tuple[list[RolloutStep], TurnResult]:
    """The turns of one episode: observe, ask the policy, act, record."""
    tracer = ctx.tracer
    system = {"role": "system",
              "content": system_prompt(settings.max_turns, settings.max_actions)}
    tools = [interact_tool(settings.max_actions)]
    image_size = settings.image_size if settings.image else None
    text = observation_text(view, 1, settings.max_turns)
    history: list[list[dict]] = []  # each earlier turn: its observation, reply and answers
    steps: list[RolloutStep] = []
    for turn in range(1, settings.max_turns + 1):
        tracer.start_timestep(f"turn-{turn}", turn_number=turn,
                              metadata={"difficulty": tier, "seed": seed})
        observation = {"role": "user", "content": [text_part(text), image_part(
            png_data_url(png))] if png else text}
        shown = [m for group in history[-settings.history_turns:] for m in group] \
            if settings.history_turns else []
        prompt = [system, *shown, observation]
        reply = await call_policy(ctx, prompt, tools=tools)
        decision = decide(reply.calls, settings.max_actions)
        exchange, problem = [reply.message], None
        if not decision.valid:  # one corrective message, one more try; then a no-op
            problem = decision.problem
            exchange += decision.corrections()
            reply = await call_policy(ctx, [*prompt, *exchange], tools=tools)
            decision = decide(reply.calls, settings.max_actions)
            exchange.append(reply.message)
        result = await episode.play(decision.actions if decision.valid else NOOP, image_size)
        exchange += decision.answers(result)
        truncated = turn == settings.max_turns and not result.died
        _record_turn(tracer, turn, result, problem, decision.valid, truncated=truncated)
        steps.append(_step(text, decision, result, problem, truncated))
        # Earlier turns are shown as text: one image (the current frame) per prompt.
        history.append([{"role": "user", "content": text}, *exchange])
        if result.died:
            break
        text, png = observation_text(result.view, turn + 1, settings.max_turns), result.png
    return steps, result


def _step(text: str, decision, result: TurnResult, problem: str | None,
          truncated: bool) -> RolloutStep:
    call = decision.executed
    return RolloutStep(
        obs={"text": text}, reward=float(result.achievement_delta),
        done=result.died or truncated, truncated=truncated,
        tool_calls=[{"id": call.id, "type": "function",
                     "function": {"name": call.name, "arguments": call.raw_arguments}}]
        if call else [],
        info={"actions": list(result.actions), "gained": result.gained,
              "new_achievements": list(result.new_unique), "reply_problem": problem,
              "noop_after_invalid_replies": not decision.valid})


def _seed_of(run_id: str) -> int:
    """A request without a seed plays the world its run id names (as synth-ai's apps do)."""
    return int(hashlib.sha256(run_id.encode()).hexdigest()[:8], 16) % (MAX_SEED + 1)


def _record_turn(tracer, turn: int, result: TurnResult, problem: str | None, valid: bool,
                 *, truncated: bool) -> None:
    view = result.view
    event = tracer.record_environment_event(
        reward=float(result.achievement_delta), terminated=result.died, truncated=truncated,
        state_after={"vitals": view.vitals, "inventory": view.inventory,
                     "achievements": list(view.achievements), "step": view.step},
        metadata={"actions": list(result.actions), "gained": result.gained,
                  "new_achievements": list(result.new_unique), "reply_problem": problem,
                  "noop_after_invalid_replies": not valid})
    tracer.record_event_reward(result.achievement_delta, reward_type="achievement_delta",
                               source="environment", turn_number=turn, event_id=event.id,
                               annotation={"achievements": result.gained})
    if result.new_unique:
        tracer.record_event_reward(len(result.new_unique),
                                   reward_type="unique_achievement_delta", source="environment",
                                   turn_number=turn, event_id=event.id,
                                   annotation={"achievements": list(result.new_unique)})


def _response(request: RolloutRequest, seed: int, tier: str, steps: list[RolloutStep],
              last: TurnResult) -> dict:
    unlocked = list(last.view.achievements)
    share = len(unlocked) / len(ACHIEVEMENTS)
    vitals = last.view.vitals
    survival = 0.0 if last.died else sum(vitals.values()) / (9 * len(vitals))
    turns = len(steps)
    events = {"achievement_delta": sum(s.reward > 0 for s in steps) / turns,
              "unique_achievement_delta": sum(bool(s.info["new_achievements"])
                                              for s in steps) / turns}
    rubric = task_app.rubrics
    inference_url = request.policy.config.get("inference_url")
    details = {
        "difficulty": tier, "achievements": len(unlocked), "turns": turns,
        "unlocked": unlocked, "achievement_share": round(share, 4), "died": last.died,
        "env_steps": last.view.step,
        "valid_first_replies": sum(not s.info["reply_problem"] for s in steps),
        "rubric": {"outcome": {"unique_achievements": share, "survival": round(survival, 4)},
                   "events": events},
    }
    return {
        "metrics": {
            "outcome_score": _weighted(rubric.outcome, {"unique_achievements": share,
                                                        "survival": survival}),
            "events_score": _weighted(rubric.events, events), "details": details},
        "trajectories": [RolloutTrajectory(
            env_id=f"crafter:{seed}:{tier}",
            policy_id=request.policy.policy_id or request.policy.policy_name or "policy",
            steps=steps, length=turns, inference_url=inference_url,
            final={"achievements": unlocked, "reward": float(len(unlocked)),
                   "died": last.died})],
        "inference_url": inference_url,
        "pipeline_metadata": {"model": request.policy.config.get("model"),
                              "tool": "interact"},
    }


def _weighted(section: RubricSection | None, scores: dict[str, float]) -> float:
    criteria = section.criteria if section else []
    total = sum(c.weight or 0.0 for c in criteria)
    return round(sum((c.weight or 0.0) * scores[c.id] for c in criteria) / total, 6) \
        if total else 0.0


app = modal_app(__file__)  # `modal deploy apps/crafter/task_app.py` deploys this
