"""Code: the model writes a Python function; hidden tests run in a sandbox.

Each seed is one function to write (easy / medium / hard: some have an edge case the
docstring names). An episode asks the policy through the trainer's
``policy.config.inference_url``, takes the last ```python block of its reply, and runs it in
a sandbox (`ctx.sandbox()`: no network, limited CPU time, memory, file size and processes)
against test cases whose expected values stay on the server:

- outcome reward: the share of the hidden tests that pass (``outcome_score`` too);
- event reward ``code_block``: 1.0 when the reply held a ```python block.

Every command the sandbox ran is in the trace (command, exit code, duration, output), its
time in the rollout's cost ledger (``sandbox_s``).

Serve it with ``synth-deploy serve code``; smoke it with ``synth-deploy smoke code``; deploy
it with ``synth-deploy deploy code`` (on Modal its sandboxes are ``modal.Sandbox``es).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

from code_problems import (
    CHECKER,
    CHECKER_FILE,
    SOLUTION_FILE,
    TEST_SEEDS,
    TRAIN_SEEDS,
    checker_input,
    extract_code,
    make_problem,
    score,
)

from synth_deploy.modal import ModalSettings, modal_app
from synth_deploy.sandbox import SandboxSettings
from synth_deploy.taskapp import (
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
)

task_app = TaskApp(
    "code",
    name="Write a function",
    description="Write a seeded Python function; reward is the share of hidden tests that "
                "pass, run in a sandbox.",
    datasets=[TaskDataset(
        id="code-functions-v1", display_name="Write a function", version="1",
        description="Seeded one-line functions, some with an edge case to handle.",
        splits=("train", "test"), default_split="train",
        default_seeds={"train": list(range(0, 100)), "test": list(range(9000, 9050))},
        seeds=range(TRAIN_SEEDS.start, TEST_SEEDS.stop))],
    rubrics=RubricBundle(
        outcome=RubricSection(name="tests", criteria=[RubricCriterion(
            id="hidden_tests", weight=1.0,
            description="The share of the hidden test cases the function passes.")]),
        events=RubricSection(name="format", criteria=[RubricCriterion(
            id="code_block", weight=1.0,
            description="The reply holds the function in a ```python block.")])),
    limits=LimitsInfo(max_turns=1, max_response_tokens=1024, timeout_seconds=120),
    sandbox=SandboxSettings(
        image="python:3.12-slim", timeout_s=120, command_timeout_s=10, cpu=0.5,
        memory_mb=256, max_file_mb=16, max_processes=16, output_bytes=16 * 1024),
    modal=ModalSettings(
        name="synth-code", python_version="3.11", memory=512, cpu=1.0, timeout=600,
        max_containers=10,
        concurrent_inputs=32,  # rollouts wait on the policy model and on their sandboxes
    ),
)

SYSTEM_PROMPT = "You write correct, minimal Python. Reply with the function in a code block."


@task_app.instances
def instances(seeds: Sequence[int]) -> list[TaskInfo]:
    result = []
    for seed in seeds:
        problem = make_problem(seed)
        info = task_app.instance(seed, difficulty=problem.difficulty, split=problem.split,
                                 function=problem.name)
        info.dataset.default_split = problem.split
        result.append(info)
    return result


@task_app.rollout
async def rollout(request: RolloutRequest, ctx: RolloutContext) -> dict:
    problem = make_problem(request.env.seed if request.env.seed is not None else 0)
    tracer = ctx.tracer
    tracer.start_timestep("turn-1", turn_number=1, metadata={"difficulty": problem.difficulty})
    messages = [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": problem.prompt}]
    reply = await call_policy(ctx, messages)
    code = extract_code(reply.content)
    passed, which = 0, [False] * len(problem.cases)
    limit = None
    if code is not None:
        box = await ctx.sandbox()  # ended with the rollout, whatever happens
        await box.write_file(SOLUTION_FILE, code)
        await box.write_file(CHECKER_FILE, CHECKER)
        token = secrets.token_hex(8)
        result = await box.run(["python3", CHECKER_FILE, problem.name],
                               stdin=checker_input(token, problem))
        passed, which = score(result.stdout, token, problem)
        limit = result.limit
    reward = passed / len(problem.cases)
    event = tracer.record_environment_event(
        reward=reward, terminated=True,
        state_after={"passed": passed, "total": len(problem.cases), "limit": limit})
    tracer.record_event_reward(float(code is not None), reward_type="code_block",
                               source="environment", turn_number=1, event_id=event.id)
    # The one place the reward is stated: the kit fills every metric spelling from it.
    tracer.record_outcome_reward(reward, achievements_count=passed, total_steps=1,
                                 metadata={"passed": passed, "total": len(problem.cases)})
    inference_url = request.policy.config.get("inference_url")
    step = RolloutStep(obs={"prompt": problem.prompt}, reward=reward, done=True,
                       info={"reply": reply.content, "passed": which, "limit": limit})
    return {
        "metrics": {"details": {"difficulty": problem.difficulty, "passed": passed,
                                "total": len(problem.cases), "limit": limit}},
        "trajectories": [RolloutTrajectory(
            env_id=f"code:{problem.seed}", policy_id=request.policy.policy_id or "policy",
            steps=[step], length=1, final={"reward": reward}, inference_url=inference_url)],
        "inference_url": inference_url,
        "pipeline_metadata": {"prompt": SYSTEM_PROMPT,
                              "model": request.policy.config.get("model")},
    }


app = modal_app(__file__)  # `modal deploy apps/code/task_app.py` deploys this
