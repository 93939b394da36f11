"""Math: arithmetic word problems for RL on a policy model.

Each seed is one problem (easy / medium / hard). An episode asks the policy through the
trainer's `policy.config.inference_url`, reads an ``Answer: N`` from the reply (one more turn
is offered when no answer can be read), and scores it:

- outcome reward: 1.0 for the right integer, else 0.0;
- event reward ``answer_format``: 1.0 when the answer was tagged as asked;
- rubric scores: ``outcome_score`` (correctness) and ``events_score`` (format).

Serve it with ``synth-deploy serve math``.
"""

from __future__ import annotations

from collections.abc import Sequence

from math_problems import TEST_SEEDS, TIERS, TRAIN_SEEDS, make_problem, parse_answer

from synth_deploy.modal import ModalSettings, modal_app
from synth_deploy.taskapp import (
    LimitsInfo,
    RolloutContext,
    RolloutMetrics,
    RolloutRequest,
    RolloutResponse,
    RolloutStep,
    RolloutTrajectory,
    RubricBundle,
    RubricCriterion,
    RubricSection,
    TaskAppConfig,
    TaskDataset,
    TaskDatasetRegistry,
    TaskDescriptor,
    TaskInfo,
    call_policy,
    register_task_app,
)

APP_ID = "math"
SYSTEM_PROMPT = (
    "You solve arithmetic word problems. Think briefly, then end with the final answer on "
    "its own line as 'Answer: <integer>'."
)
RETRY_PROMPT = "I could not find your final answer. Reply with 'Answer: <integer>' only."

DATASET = TaskDataset(
    id="math-arith-v1",
    display_name="Arithmetic word problems",
    description="Seeded problems in three tiers: easy (a ± b), medium (a × b ± c), "
                "hard (multi-step word problems).",
    version="1",
    splits=("train", "test"),
    default_split="train",
    default_seeds={"train": list(range(0, 100)), "test": list(range(9000, 9050))},
)

RUBRICS = RubricBundle(
    outcome=RubricSection(name="correctness", criteria=[
        RubricCriterion(id="correct_answer", description="The final integer equals the "
                        "problem's answer.", weight=1.0)]),
    events=RubricSection(name="format", criteria=[
        RubricCriterion(id="answer_format", description="The reply states the final answer "
                        "as 'Answer: <integer>'.", weight=1.0)]),
)

BASE_TASK_INFO = TaskInfo(
    task=TaskDescriptor(id=APP_ID, name="Arithmetic word problems", version="1",
                        description="Solve a seeded arithmetic problem; reward 1 if correct."),
    environment="math",
    dataset=DATASET.to_info(),
    rubric=RUBRICS.to_info(),
    limits=LimitsInfo(max_turns=2, max_response_tokens=512, timeout_seconds=120),
)


def provide_task_instances(seeds: Sequence[int]) -> list[TaskInfo]:
    instances = []
    for seed in seeds:
        problem = make_problem(seed)
        info = BASE_TASK_INFO.model_copy(deep=True)
        info.dataset.default_split = problem.split
        info.task_metadata = {"seed": seed, "difficulty": problem.difficulty,
                              "split": problem.split, "template": problem.template,
                              "question": problem.question}
        instances.append(info)
    return instances


async def rollout(request: RolloutRequest, ctx: RolloutContext) -> RolloutResponse:
    seed = request.env.seed if request.env.seed is not None else 0
    problem = make_problem(seed)
    max_turns = int(request.env.config.get("max_turns", 2))
    tracer = ctx.tracer
    messages = [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": problem.question}]
    steps: list[RolloutStep] = []
    parsed = None
    for turn in range(1, max_turns + 1):
        tracer.start_timestep(f"turn-{turn}", turn_number=turn,
                              metadata={"difficulty": problem.difficulty})
        reply = await call_policy(ctx, messages)
        parsed = parse_answer(reply.content)
        last_turn = turn == max_turns
        done = parsed.well_formatted or last_turn
        event = tracer.record_environment_event(
            reward=float(parsed.value == problem.answer) if done else 0.0,
            # Out of turns without a tagged answer: cut short, not finished.
            terminated=parsed.well_formatted, truncated=last_turn and not parsed.well_formatted,
            state_after={"parsed_answer": parsed.value, "well_formatted": parsed.well_formatted})
        tracer.record_event_reward(float(parsed.well_formatted), reward_type="answer_format",
                                   source="environment", turn_number=turn, event_id=event.id)
        steps.append(RolloutStep(obs={"question": problem.question}, reward=event.reward,
                                 done=done, truncated=event.truncated, info={"reply": reply.content,
                                                  "parsed_answer": parsed.value}))
        if done:
            break
        messages += [{"role": "assistant", "content": reply.content},
                     {"role": "user", "content": RETRY_PROMPT}]

    correct = parsed is not None and parsed.value == problem.answer
    outcome = 1.0 if correct else 0.0
    formatted = 1.0 if parsed is not None and parsed.well_formatted else 0.0
    tracer.record_outcome_reward(outcome, achievements_count=int(correct),
                                 total_steps=len(steps),
                                 metadata={"expected": problem.answer,
                                           "parsed": parsed.value if parsed else None})
    policy_cfg = request.policy.config
    return RolloutResponse(
        run_id=request.run_id,
        metrics=RolloutMetrics(
            episode_rewards=[outcome], outcome_reward=outcome, event_rewards=[formatted],
            num_steps=len(steps), num_episodes=1, outcome_score=outcome, events_score=formatted,
            details={"difficulty": problem.difficulty, "expected": problem.answer,
                     "parsed": parsed.value if parsed else None, "correct": correct,
                     "turns": len(steps)}),
        trajectories=[RolloutTrajectory(env_id=f"math:{seed}",
                                        policy_id=request.policy.policy_id or "policy",
                                        steps=steps, length=len(steps),
                                        final={"reward": outcome},
                                        inference_url=policy_cfg.get("inference_url"))],
        inference_url=policy_cfg.get("inference_url"),
        pipeline_metadata={"prompt": SYSTEM_PROMPT, "model": policy_cfg.get("model")},
    )


def describe_taskset() -> dict:
    return {"id": APP_ID, "name": "Arithmetic word problems", "tiers": list(TIERS),
            "splits": {"train": [TRAIN_SEEDS.start, TRAIN_SEEDS.stop - 1],
                       "test": [TEST_SEEDS.start, TEST_SEEDS.stop - 1]}}


def build_config() -> TaskAppConfig:
    return TaskAppConfig(
        app_id=APP_ID,
        name="Math (arithmetic word problems)",
        description=__doc__.strip().splitlines()[0],
        base_task_info=BASE_TASK_INFO,
        describe_taskset=describe_taskset,
        provide_task_instances=provide_task_instances,
        rollout=rollout,
        dataset_registry=TaskDatasetRegistry([DATASET]),
        rubrics=RUBRICS,
    )


register_task_app(
    app_id=APP_ID,
    config_factory=build_config,
    description="Arithmetic word problems in three tiers (a real, trainable example).",
    modal=ModalSettings(
        name="synth-math",
        python_version="3.11",
        memory=512,
        cpu=1.0,
        timeout=600,
        max_containers=10,
        concurrent_inputs=32,  # rollouts mostly wait on the policy model
    ),
)


app = modal_app(__file__)  # `modal deploy apps/math/task_app.py` deploys this
