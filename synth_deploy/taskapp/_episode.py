"""The episode loop a declared environment gets for ``/rollout``: reset, then each turn
ask the policy (`call_policy`) with the environment's tool, step with the action it calls,
and answer a refused or malformed call once before the episode ends.

Its own module so that the environment's rules (`_environment`) do not depend on the policy
call, which depends on the config, which names the environment.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from synth_deploy.errors import InvalidAction
from synth_deploy.taskapp._environment import (
    EnvironmentSpec,
    EnvironmentThread,
    Outcome,
    Step,
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
        thread = EnvironmentThread()
        with thread.current():
            try:
                env = await call(spec.new)
            except BaseException:
                thread.end()
                spec.release_slot()
                raise
            try:  # past the time budget, a step still running is abandoned (`_retire_later`)
                first = await reset(env, request.env.seed, episode_id=request.run_id,
                                    config=request.env.config)
                return await _play(spec, env, first, request, ctx, call_policy, limit)
            finally:
                if thread.busy:
                    _retire_later(spec, env, thread)
                else:
                    try:
                        await close(env)
                    finally:
                        thread.end()
                        spec.release_slot()

    rollout.__name__ = rollout.__qualname__ = f"{spec.name}.episode"
    return rollout


_retiring: set[asyncio.Task[None]] = set()  # held until done: the loop keeps weak references


def _retire_later(spec: EnvironmentSpec, env: Any, thread: EnvironmentThread) -> None:
    """An episode answered while a sync call of its environment still runs on its thread
    (its time budget spent): the environment is closed on that thread once the call returns,
    then its slot freed, so no two calls ever use one instance at once."""

    async def retire() -> None:
        try:
            with thread.current():
                await close(env)  # waits its turn behind the call still running
        finally:
            thread.end()
            spec.release_slot()

    task = asyncio.get_running_loop().create_task(retire())
    _retiring.add(task)
    task.add_done_callback(_retiring.discard)


async def _play(spec: EnvironmentSpec, env: Any, first: Step, request: RolloutRequest, ctx: Any,
                call_policy: Callable[..., Any], limit: tuple[int, str]) -> dict[str, Any]:
    episode = _Episode(spec, env, request, ctx, call_policy, limit)
    await episode.begin()
    observation, done = first.observation, first.done
    while not done:
        observation, done = await episode.turn(observation)
    return await episode.answer()


class _Episode:
    """One derived episode as it is played: the conversation so far (its history, shown to
    the policy), the steps taken, and how it ended."""

    def __init__(self, spec: EnvironmentSpec, env: Any, request: RolloutRequest, ctx: Any,
                 call_policy: Callable[..., Any], limit: tuple[int, str]) -> None:
        self.spec, self.env, self.request, self.ctx = spec, env, request, ctx
        self.call_policy = call_policy
        self.max_turns, self.cap_source = limit
        self.tracer = ctx.tracer
        self.noop = getattr(env, "noop", None)
        self.keep = getattr(env, "history_turns", None)
        self.history: list[list[dict[str, Any]]] = []
        self.steps: list[RolloutStep] = []
        self.turns, self.capped = 0, False
        self.ended = "the environment was done at reset"
        self.tool_name = ""
        self.system: dict[str, Any] = {}

    async def begin(self) -> None:
        spec, env = self.spec, self.env
        self.tool_name = " or ".join(t["function"]["name"] for t in await spec.offered(env))
        self.system = {"role": "system", "content": await spec.system_prompt(env)}

    async def turn(self, observation: Any) -> tuple[Any, bool]:
        """Play one turn from ``observation``: the next observation, and whether done."""
        self.turns += 1
        turn, env = self.turns, self.env
        tools = await self.spec.offered(env)  # each turn: the moves legal now may change
        self.tool_name = " or ".join(t["function"]["name"] for t in tools)
        self.tracer.start_timestep(f"turn-{turn}", turn_number=turn,
                                   metadata=timestep_metadata(env, self.request.env.seed))
        content = prompt_of(env, observation)
        attempt, problem, exchange = await self._reply(content, tools)
        missed = attempt.step is None
        result = await self._result(attempt, observation)
        self.capped = not result.done and turn >= self.max_turns
        if self.capped:
            result.done = result.truncated = True
        exchange += attempt.answers(_result_text(result))
        self._record(result, attempt, content, problem=problem, missed=missed)
        self.history.append([{"role": "user", "content": text_of(content)}, *exchange])
        self.ended = self._ending(result, attempt, missed)
        return result.observation, result.done

    async def _reply(self, content: Any, tools: list[dict[str, Any]]
                     ) -> tuple[Any, str | None, list[dict[str, Any]]]:
        """The policy's action for this turn, asked again once when its reply holds none:
        the attempt, the first reply's problem, and the exchange to keep."""
        shown = self.history if self.keep is None else \
            self.history[-self.keep:] if self.keep else []
        messages = [self.system, *(m for group in shown for m in group),
                    {"role": "user", "content": content}]
        reply = await self.call_policy(self.ctx, messages, tools=tools)
        exchange = [reply.message]
        attempt, problem = await _attempt(self.env, reply.calls, tools), None
        if attempt.step is None:  # one correction, one more try
            problem = attempt.problem
            no_call = getattr(self.env, "no_call_message", None) or (
                f"You did not call the {self.tool_name} tool. Reply with a call of "
                f"{self.tool_name}.")
            exchange += attempt.corrections(no_call)
            reply = await self.call_policy(self.ctx, [*messages, *exchange], tools=tools)
            exchange.append(reply.message)
            attempt = await _attempt(self.env, reply.calls, tools)
        return attempt, problem, exchange

    async def _result(self, attempt: Any, observation: Any) -> Step:
        """The step the turn took: the action's, the noop's, or the end of the episode."""
        if attempt.step is not None:
            return attempt.step
        if self.noop is not None:
            return await step(self.env, self.noop)
        return Step(observation, done=True, truncated=True,
                    message="no valid action: the episode ends")

    def _record(self, result: Step, attempt: Any, content: Any, *, problem: str | None,
                missed: bool) -> None:
        """The turn's environment event, its rewards, and its step of the trajectory."""
        info = {**result.info, "reply_problem": problem, "noop_after_invalid_replies": missed}
        if self.capped:
            info["turn_cap"] = self.max_turns
        event = self.tracer.record_environment_event(
            reward=float(result.reward), terminated=result.done and not result.truncated,
            truncated=result.truncated, state_after=result.state, metadata=info)
        for r in result.rewards:
            self.tracer.record_event_reward(r.value, reward_type=r.kind, source="environment",
                                            turn_number=self.turns, event_id=event.id,
                                            annotation=r.annotation)
        executed = attempt.executed
        self.steps.append(RolloutStep(
            obs={"text": text_of(content)}, reward=float(result.reward), done=result.done,
            truncated=result.truncated, info=info,
            tool_calls=[{"id": executed.id, "type": "function",
                         "function": {"name": executed.name,
                                      "arguments": executed.raw_arguments}}]
            if executed else []))

    def _ending(self, result: Step, attempt: Any, missed: bool) -> str:
        """How the episode stands after this turn, said in its details."""
        turn = self.turns
        if missed and self.noop is None:
            return (f"no valid action at turn {turn}, twice ({attempt.problem}): the episode "
                    f"was cut (to play on instead, give the environment an action for such a "
                    f"turn: a `noop = {{...}}` class attribute holding {self.tool_name}'s "
                    "arguments, or `task_app.openenv(..., noop={...})` with an action's "
                    "fields)")
        if self.capped:
            return (f"cut at the turn cap: max_turns={self.max_turns} ({self.cap_source}); "
                    "the environment had not said done")
        if result.truncated:
            return f"truncated at turn {turn}"
        return f"done at turn {turn}"

    async def answer(self) -> dict[str, Any]:
        """The episode's outcome recorded, and its answer as a rollout's result."""
        env, steps, spec, request = self.env, self.steps, self.spec, self.request
        if callable(getattr(env, "outcome", None)):
            outcome = await call(env.outcome, steps)
        else:
            outcome = Outcome(reward=sum(s.reward or 0.0 for s in steps))
        self.tracer.record_outcome_reward(
            float(outcome.reward), achievements_count=outcome.achievements,
            total_steps=len(steps), metadata=dict(outcome.metadata))
        policy = request.policy
        inference_url = policy.config.get("inference_url")
        return {
            "metrics": self._metrics(outcome),
            "trajectories": [RolloutTrajectory(
                env_id=outcome.env_id or f"{spec.app_id}:{request.env.seed}",
                policy_id=policy.policy_id or policy.policy_name or "policy", steps=steps,
                length=len(steps), inference_url=inference_url,
                final=dict(outcome.final) if outcome.final is not None else {
                    "reward": float(outcome.reward)})],
            "inference_url": inference_url,
            "pipeline_metadata": {"model": policy.config.get("model"), "tool": self.tool_name},
        }

    def _metrics(self, outcome: Outcome) -> dict[str, Any]:
        """The outcome's metrics, their details saying how the episode ended."""
        metrics = dict(outcome.metrics)
        details = metrics.get("details")
        seed_ignored = getattr(self.env, "seed_ignored", None)
        metrics["details"] = {"ended": self.ended,
                              **({"seed_ignored": seed_ignored} if seed_ignored else {}),
                              **(dict(details) if isinstance(details, Mapping) else {})}
        if self.capped:
            metrics["details"]["turn_cap"] = self.max_turns
        return metrics


# -- an OpenEnv Environment class as a declared environment ---------------------------------------


__all__ = ["episode_rollout"]
