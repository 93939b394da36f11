"""The episode loop a declared environment gets for ``/rollout``: reset, then each turn
ask the policy (`call_policy`) with the environment's tool, step with the action it calls,
and answer a refused or malformed call once before the episode ends.

Its own module so that the environment's rules (`_environment`) do not depend on the policy
call, which depends on the config, which names the environment.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from synth_deploy.errors import InvalidAction
from synth_deploy.taskapp._environment import (
    EnvironmentSpec,
    Outcome,
    Step,
    abandonable,
    call,
    close,
    prompt_of,
    reset,
    step,
    text_of,
    timestep_metadata,
)
from synth_deploy.taskapp.contracts import RolloutRequest, RolloutStep, RolloutTrajectory
from synth_deploy.taskapp.tools import ToolCall, tool_message


@dataclass
class _Attempt:
    """A reply's tool calls tried in order: the first call of the tool that the environment
    accepts is executed, every other call has a problem."""

    calls: list[ToolCall]
    executed: ToolCall | None = None
    step: Step | None = None
    problems: dict[str, str] = field(default_factory=dict)

    @property
    def problem(self) -> str:
        if not self.calls:
            return "no tool call"
        return "; ".join(self.problems.values())

    def corrections(self, no_call_message: str) -> list[dict[str, Any]]:
        if not self.calls:
            return [{"role": "user", "content": no_call_message}]
        return [tool_message(c.id, f"error: {self.problems[c.id]}") for c in self.calls]

    def answers(self, result: str) -> list[dict[str, Any]]:
        return [tool_message(c.id, result if c is self.executed
                             else f"error: {self.problems[c.id]}") for c in self.calls]


async def _attempt(env: Any, calls: list[ToolCall], tools: list[dict[str, Any]]) -> _Attempt:
    names = [t["function"]["name"] for t in tools]
    action_for = getattr(env, "action_for", None)
    attempt = _Attempt(list(calls))
    for c in calls:
        if attempt.executed is not None:
            attempt.problems[c.id] = (f"not executed: one {names[0] if len(names) == 1 else 'tool'}"
                                      " call per turn")
        elif c.name not in names:
            attempt.problems[c.id] = f"unknown tool {c.name!r}; " + (
                f"the only tool is {names[0]}" if len(names) == 1
                else f"the tools are {', '.join(names)}")
        elif c.arguments is None:
            attempt.problems[c.id] = c.error or "arguments could not be read"
        else:
            try:
                action = action_for(c.name, c.arguments) if action_for else c.arguments
                attempt.step = await step(env, action)
                attempt.executed = c
            except InvalidAction as exc:
                attempt.problems[c.id] = exc.message
    return attempt


def _result_text(result: Step) -> str:
    if result.message is not None:
        return result.message
    return f"reward {result.reward:g}" + ("; the episode is over" if result.done else "")


def episode_rollout(spec: EnvironmentSpec) -> Callable[..., Any]:
    """The ``/rollout`` executor derived from ``spec``: one episode per request."""
    from synth_deploy.taskapp.policy import call_policy

    async def rollout(request: RolloutRequest, ctx: Any) -> dict[str, Any]:
        limit = spec.turn_limit(request.env.config)  # a bad value is refused before reset
        await spec.wait_for_slot()  # the environment's max_sessions, if it has one
        left: list[threading.Event] = []
        try:
            env = spec.new()
        except BaseException:
            spec.release_slot()
            raise
        try:
            with abandonable() as left:  # past the time budget, a step is not waited for
                first = await reset(env, request.env.seed, episode_id=request.run_id,
                                    config=request.env.config)
                return await _play(spec, env, first, request, ctx, call_policy, limit)
        finally:
            running = [ended for ended in left if not ended.is_set()]
            if running:
                _retire_later(spec, env, running)
            else:
                try:
                    await close(env)
                finally:
                    spec.release_slot()

    rollout.__name__ = rollout.__qualname__ = f"{spec.name}.episode"
    return rollout


_retiring: set[asyncio.Task[None]] = set()  # held until done: the loop keeps weak references


def _retire_later(spec: EnvironmentSpec, env: Any, running: list[threading.Event]) -> None:
    """An episode answered while a sync call of its environment still runs on its thread
    (its time budget spent): once that call returns, the environment is closed and its slot
    freed, so no two threads ever use one instance."""
    import anyio

    async def retire() -> None:
        try:
            for ended in running:
                await anyio.to_thread.run_sync(ended.wait)
            await close(env)
        finally:
            spec.release_slot()

    task = asyncio.get_running_loop().create_task(retire())
    _retiring.add(task)
    task.add_done_callback(_retiring.discard)


async def _play(spec: EnvironmentSpec, env: Any, first: Step, request: RolloutRequest, ctx: Any,
                call_policy: Callable[..., Any], limit: tuple[int, str]) -> dict[str, Any]:
    tracer = ctx.tracer
    tool_name = " or ".join(t["function"]["name"] for t in await spec.offered(env))
    system = {"role": "system", "content": await spec.system_prompt(env)}
    noop = getattr(env, "noop", None)
    ended = "the environment was done at reset"
    keep = getattr(env, "history_turns", None)
    history: list[list[dict[str, Any]]] = []
    steps: list[RolloutStep] = []
    observation, done = first.observation, first.done
    turn, capped = 0, False
    max_turns, cap_source = limit
    while not done:
        turn += 1
        tools = await spec.offered(env)  # each turn: the moves legal now may change
        tool_name = " or ".join(t["function"]["name"] for t in tools)
        no_call = getattr(env, "no_call_message", None) or (
            f"You did not call the {tool_name} tool. Reply with a call of {tool_name}.")
        tracer.start_timestep(f"turn-{turn}", turn_number=turn,
                              metadata=timestep_metadata(env, request.env.seed))
        content = prompt_of(env, observation)
        shown = history if keep is None else history[-keep:] if keep else []
        messages = [system, *(m for group in shown for m in group),
                    {"role": "user", "content": content}]
        reply = await call_policy(ctx, messages, tools=tools)
        exchange = [reply.message]
        attempt, problem = await _attempt(env, reply.calls, tools), None
        if attempt.step is None:  # one correction, one more try
            problem = attempt.problem
            exchange += attempt.corrections(no_call)
            reply = await call_policy(ctx, [*messages, *exchange], tools=tools)
            exchange.append(reply.message)
            attempt = await _attempt(env, reply.calls, tools)
        missed = attempt.step is None
        if not missed:
            result = attempt.step
        elif noop is not None:
            result = await step(env, noop)
        else:
            result = Step(observation, done=True, truncated=True,
                          message="no valid action: the episode ends")
        capped = not result.done and turn >= max_turns
        if capped:
            result.done = result.truncated = True
        exchange += attempt.answers(_result_text(result))
        info = {**result.info, "reply_problem": problem, "noop_after_invalid_replies": missed}
        if capped:
            info["turn_cap"] = max_turns
        event = tracer.record_environment_event(
            reward=float(result.reward), terminated=result.done and not result.truncated,
            truncated=result.truncated, state_after=result.state, metadata=info)
        for r in result.rewards:
            tracer.record_event_reward(r.value, reward_type=r.kind, source="environment",
                                       turn_number=turn, event_id=event.id,
                                       annotation=r.annotation)
        executed = attempt.executed
        steps.append(RolloutStep(
            obs={"text": text_of(content)}, reward=float(result.reward), done=result.done,
            truncated=result.truncated, info=info,
            tool_calls=[{"id": executed.id, "type": "function",
                         "function": {"name": executed.name,
                                      "arguments": executed.raw_arguments}}]
            if executed else []))
        history.append([{"role": "user", "content": text_of(content)}, *exchange])
        observation, done = result.observation, result.done
        if missed and noop is None:
            ended = (f"no valid action at turn {turn}, twice ({attempt.problem}): the episode "
                     f"was cut (to play on instead, give the environment an action for such a "
                     f"turn: a `noop = {{...}}` class attribute holding {tool_name}'s "
                     "arguments, or `task_app.openenv(..., noop={...})` with an action's "
                     "fields)")
        elif capped:
            ended = (f"cut at the turn cap: max_turns={max_turns} ({cap_source}); the "
                     "environment had not said done")
        elif result.truncated:
            ended = f"truncated at turn {turn}"
        else:
            ended = f"done at turn {turn}"
    if callable(getattr(env, "outcome", None)):
        outcome = await call(env.outcome, steps)
    else:
        outcome = Outcome(reward=sum(s.reward or 0.0 for s in steps))
    tracer.record_outcome_reward(float(outcome.reward), achievements_count=outcome.achievements,
                                 total_steps=len(steps), metadata=dict(outcome.metadata))
    policy = request.policy
    inference_url = policy.config.get("inference_url")
    metrics = dict(outcome.metrics)
    details = metrics.get("details")
    seed_ignored = getattr(env, "seed_ignored", None)
    metrics["details"] = {"ended": ended, **({"seed_ignored": seed_ignored} if seed_ignored
                                             else {}),
                          **(dict(details) if isinstance(details, Mapping) else {})}
    if capped:
        metrics["details"]["turn_cap"] = max_turns
    return {
        "metrics": metrics,
        "trajectories": [RolloutTrajectory(
            env_id=outcome.env_id or f"{spec.app_id}:{request.env.seed}",
            policy_id=policy.policy_id or policy.policy_name or "policy", steps=steps,
            length=len(steps), inference_url=inference_url,
            final=dict(outcome.final) if outcome.final is not None else {
                "reward": float(outcome.reward)})],
        "inference_url": inference_url,
        "pipeline_metadata": {"model": policy.config.get("model"), "tool": tool_name},
    }




# -- an OpenEnv Environment class as a declared environment ---------------------------------------


__all__ = ["episode_rollout"]
