"""Math: arithmetic word problems for RL on a policy model.

Each seed is one problem (easy / medium / hard). An episode asks the policy through the
trainer's `policy.config.inference_url`, reads an ``Answer: N`` from the reply (one more turn
is offered when no answer can be read), and scores it:

- outcome reward: 1.0 for the right integer, else 0.0 (``outcome_score`` too);
- event reward ``answer_format``: 1.0 when the answer was tagged as asked (``events_score``).

The same problems are an environment (`MathEnvironment`: reset with a seed, step with
``{"answer": <integer>}``), served on OpenEnv's wire at ``/openenv`` for OpenEnv's clients.
Its scorer (`score`) gives a stored episode its reward again from the trace, so a changed
rule applies to rollouts already run (``synth-deploy traces rescore math``).

Serve it with ``synth-deploy serve math``; deploy it with ``synth-deploy deploy math`` or
plain ``modal deploy apps/math/task_app.py``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from math_problems import TEST_SEEDS, TIERS, TRAIN_SEEDS, make_problem, parse_answer

from synth_deploy.modal import ModalSettings, modal_app
from synth_deploy.taskapp import (
    BadRequest,
    InvalidAction,
    LimitsInfo,
    RolloutContext,
    RolloutRequest,
    RolloutStep,
    RolloutTrajectory,
    RubricBundle,
    RubricCriterion,
    RubricSection,
    Step,
    TaskApp,
    TaskDataset,
    TaskInfo,
    call_policy,
    function_tool,
)

# -- what this app is, what it offers, how it is judged and where it runs ---------------------

task_app = TaskApp(
    "math",
    name="Arithmetic word problems",
    description="Solve a seeded arithmetic problem in three tiers; reward 1 if correct.",
    datasets=[TaskDataset(
        id="math-arith-v1", display_name="Arithmetic word problems", version="1",
        description="Seeded problems: easy (a ± b), medium (a × b ± c), hard (word problems).",
        splits=("train", "test"), default_split="train",
        default_seeds={"train": list(range(0, 100)), "test": list(range(9000, 9050))},
        seeds=range(TRAIN_SEEDS.start, TEST_SEEDS.stop),
        split_seeds={"train": TRAIN_SEEDS, "test": TEST_SEEDS})],
    rubrics=RubricBundle(
        outcome=RubricSection(name="correctness", criteria=[RubricCriterion(
            id="correct_answer", weight=1.0,
            description="The final integer equals the problem's answer.")]),
        events=RubricSection(name="format", criteria=[RubricCriterion(
            id="answer_format", weight=1.0,
            description="The reply states the final answer as 'Answer: <integer>'.")])),
    limits=LimitsInfo(max_turns=2, max_response_tokens=512, timeout_seconds=120),
    modal=ModalSettings(
        name="synth-math", python_version="3.11", memory=512, cpu=1.0, timeout=600,
        max_containers=10,
        concurrent_inputs=32,  # rollouts mostly wait on the policy model
    ),
)

SYSTEM_PROMPT = (
    "You solve arithmetic word problems. Think briefly, then end with the final answer on "
    "its own line as 'Answer: <integer>'."
)
RETRY_PROMPT = "I could not find your final answer. Reply with 'Answer: <integer>' only."


# -- seeds -> task instances --------------------------------------------------------------------

@task_app.instances
def instances(seeds: Sequence[int]) -> list[TaskInfo]:
    result = []
    for seed in seeds:
        problem = make_problem(seed)
        info = task_app.instance(seed, difficulty=problem.difficulty, split=problem.split,
                                 template=problem.template, question=problem.question)
        info.dataset.default_split = problem.split
        result.append(info)
    return result


@task_app.taskset
def taskset() -> dict:
    return {"id": task_app.app_id, "name": task_app.name, "tiers": list(TIERS),
            "splits": {"train": [TRAIN_SEEDS.start, TRAIN_SEEDS.stop - 1],
                       "test": [TEST_SEEDS.start, TEST_SEEDS.stop - 1]}}


# -- one episode --------------------------------------------------------------------------------

def _max_turns(value: object) -> int:
    try:
        turns = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        turns = 0
    if not 1 <= turns <= 10:  # the client's mistake: a 422 naming the field, not a 500
        raise BadRequest(f"env.config.max_turns must be an integer from 1 to 10, got "
                         f"{str(value)[:40]!r}", field="env.config.max_turns")
    return turns


@task_app.rollout
async def rollout(request: RolloutRequest, ctx: RolloutContext) -> dict:
    problem = make_problem(request.env.seed if request.env.seed is not None else 0)
    max_turns = _max_turns(request.env.config.get("max_turns", 2))
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
                                 done=done, truncated=event.truncated,
                                 info={"reply": reply.content, "parsed_answer": parsed.value}))
        if done:
            break
        messages += [{"role": "assistant", "content": reply.content},
                     {"role": "user", "content": RETRY_PROMPT}]

    answer = parsed.value if parsed else None
    correct = answer == problem.answer
    # The one place the reward is stated: the kit fills every metric spelling from it.
    tracer.record_outcome_reward(float(correct), achievements_count=int(correct),
                                 total_steps=len(steps),
                                 metadata={"expected": problem.answer, "parsed": answer})
    inference_url = request.policy.config.get("inference_url")
    return {
        "metrics": {"details": {"difficulty": problem.difficulty, "expected": problem.answer,
                                "parsed": answer, "correct": correct, "turns": len(steps)}},
        "trajectories": [RolloutTrajectory(
            env_id=f"math:{problem.seed}", policy_id=request.policy.policy_id or "policy",
            steps=steps, length=len(steps), final={"reward": float(correct)},
            inference_url=inference_url)],
        "inference_url": inference_url,
        "pipeline_metadata": {"prompt": SYSTEM_PROMPT,
                              "model": request.policy.config.get("model")},
    }


# -- the reward again, from a stored episode (`synth-deploy traces rescore math`) ----------------

@task_app.scorer(stateless=True)  # the seed says the problem; the trace keeps every reply
def score(session) -> float | None:
    replies = [m.content for m in session.messages if m.message_type == "assistant"]
    if not replies:  # an OpenEnv episode answers through its tool: nothing to read here
        return None
    seed = session.metadata.get("seed")
    problem = make_problem(seed if seed is not None else 0)
    return float(parse_answer(str(replies[-1])).value == problem.answer)


# -- the same problems as an environment (OpenEnv's wire: /openenv) --------------------------------

@task_app.environment
class MathEnvironment:
    """One problem an episode: the observation is the question, the action the answer."""

    tool = function_tool("answer", "Give the final answer to the problem.", {
        "type": "object", "properties": {"answer": {"type": "integer"}},
        "required": ["answer"], "additionalProperties": False})

    def reset(self, seed, *, episode_id, config):
        if seed is None:  # a client that names no seed gets a new train problem each time
            seed = random.choice(TRAIN_SEEDS)
        self.problem, self.done = make_problem(seed), False
        self.timestep_metadata = {"seed": seed}  # the trace says which problem was asked
        return {"text": self.problem.question, "difficulty": self.problem.difficulty}

    def step(self, action):
        if self.done:  # answered already: nothing more to earn until the next reset
            return Step({"text": "The episode is over: reset for a new problem."},
                        done=True, info={"after_done": True})
        answer = action.get("answer")
        if isinstance(answer, bool) or not isinstance(answer, int):
            raise InvalidAction(f"answer must be an integer, got {str(answer)[:40]!r}")
        correct, self.done = answer == self.problem.answer, True
        return Step({"text": "Correct." if correct else "Not correct.", "correct": correct},
                    reward=float(correct), done=True, info={"answer": answer})


app = modal_app(__file__)  # `modal deploy apps/math/task_app.py` deploys this
