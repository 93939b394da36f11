"""An environment, declared once: reset with a seed, step with an action.

    @task_app.environment
    class Guess:
        tool = function_tool("guess", "Guess the number.", {...})  # the action's JSON schema

        def reset(self, seed, *, episode_id, config):
            return {"text": "I picked a number from 1 to 10."}       # the observation

        def step(self, action):                                      # the tool's arguments
            if action.get("number") not in range(1, 11):
                raise InvalidAction("number must be 1-10")           # nothing changed
            return Step({"text": "Right!"}, reward=1.0, done=True)

From it the kit derives the episode loop of ``/rollout`` (`_episode.episode_rollout`): the policy is
called through the request's ``inference_url`` with the observation, its call of ``tool`` is
the action, each step's reward, state and named rewards go to the trace, and the answer is the
one synth-ai's trainer expects. The same declaration is served on OpenEnv's wire (`_openenv`).

Methods may be sync (run on the instance's own thread, `EnvironmentThread`) or async (run on
the loop). Beside ``tool``,
``reset`` and ``step``, an environment may define:

- ``prompt(observation)``: what the policy is shown (text, or content parts with images);
  default: the observation's ``"text"``, else its JSON;
- ``system_prompt()``: the system message (default: the app's description and the tool);
- ``state()``: a dict for OpenEnv's ``/state`` (the kit adds ``episode_id``, ``step_count``);
- ``outcome(steps)``: the episode's `Outcome` (default: the sum of the step rewards);
- ``close()``; ``noop`` (the action a turn takes after a second reply without a valid call;
  without it such a turn ends the episode); ``seed_ignored`` (read after reset: why the
  seed did not reach the environment, noted in the episode's details); ``no_call_message``;
  ``history_turns`` (earlier turns shown to the policy, as text; default all);
  ``timestep_metadata`` (a dict each traced step carries, read after reset; default: the
  requested seed);
- ``max_turns`` (the decorator's argument, ``@task_app.environment(max_turns=50)``, else the
  `TaskApp`'s, else `DEFAULT_MAX_TURNS`): steps an episode may take before the kit cuts it
  (truncated, and its details say so); a request's ``env.config.max_turns`` (what a trainer's
  ``[rollout] max_turns`` sends) sets it for that episode;
- ``max_sessions`` (class attribute): instances alive at once in the process, below the
  server's capacity (1 for an environment that is not safe to run twice in one process):
  /rollout's episodes and OpenEnv's sessions together; an episode waits its turn, a session
  is refused;
- ``observation_schema``, ``state_schema`` (and ``reset_observation_schema``,
  ``action_schema`` when they differ from the observation's and the tool's): JSON schemas
  ``/openenv/schema`` publishes.

``reset`` gets only the keywords its signature accepts (``episode_id``, ``config``), as
OpenEnv's server passes a reset's arguments. An action is checked against the tool's schema
before ``step`` sees it: a missing required field, or a field the schema forbids
(``additionalProperties: false``), is refused as an `InvalidAction` naming the field.
"""

from __future__ import annotations

import _thread
import asyncio
import collections
import contextlib
import contextvars
import functools
import inspect
import json
import queue
import sys
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from synth_deploy.errors import BadRequest, InvalidAction, TaskAppError

# The turn cap of an environment that states none: an episode that never ends still ends.
DEFAULT_MAX_TURNS = 100


@dataclass(frozen=True)
class Reward:
    """A named reward of one step (traced as an event reward: ``kind`` is its type)."""

    kind: str
    value: float
    annotation: Mapping[str, Any] | Sequence[Any] | None = None


@dataclass
class Step:
    """What an action did: the next observation (a JSON object), its reward, whether the
    episode is over (``truncated``: cut short rather than finished), ``info`` for the trace
    and the trajectory, ``state`` (the trace's state after the step), ``rewards`` (named
    rewards) and ``message`` (the tool result the policy reads; default: the reward)."""

    observation: dict[str, Any]
    reward: float = 0.0
    done: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] | None = None
    rewards: Sequence[Reward] = ()
    message: str | None = None
    # An OpenEnv environment's step as OpenEnv's server sends it (`from_openenv`): its wire
    # carries this as the environment made it (a reset's reward of None, its metadata).
    served: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Outcome:
    """An episode's result: its outcome ``reward`` (with ``achievements`` and ``metadata``
    for the trace), ``metrics`` merged into the rollout's (scores, ``details``), and the
    trajectory's ``final`` and ``env_id``."""

    reward: float
    achievements: int = 0
    metadata: Mapping[str, Any] = field(default_factory=dict)
    metrics: Mapping[str, Any] = field(default_factory=dict)
    final: Mapping[str, Any] | None = None
    env_id: str | None = None


class _Current:
    """`EnvironmentThread.current`'s block (a class: every environment call passes one)."""

    __slots__ = ("thread", "token")

    def __init__(self, thread: EnvironmentThread) -> None:
        self.thread = thread

    def __enter__(self) -> EnvironmentThread:
        self.token = _CURRENT.set(self.thread)
        return self.thread

    def __exit__(self, *exc: object) -> None:
        _CURRENT.reset(self.token)


class EnvironmentThread:
    """The one thread an environment instance lives on, as in OpenEnv's server: it is made
    there and each of its sync methods runs there, one after another. An environment that
    holds something bound to its thread (a sqlite3 connection, a simulator's context) works;
    no two of its calls ever run at once, even when one was abandoned (`run`); and a call is
    one hand-off to a thread already waiting for it, its answer one wake-up of the loop.
    `end` lets the thread exit once its calls are done.

        with EnvironmentThread():              # `call` runs sync methods on it
            env = await call(spec.new)
            first = await reset(env, seed, episode_id=..., config={})
            await close(env)
        # ended: its thread exits (`current()` and `end()` when it must outlive the block)
    """

    live = 0  # threads of this process not yet ended (`_switch_interval`)

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._pending = 0  # calls handed over whose end the loop has not heard yet
        self._started = self._ended = False
        _count_thread(+1)

    def current(self) -> _Current:
        """Within the block, `call` runs sync functions on this thread."""
        return _Current(self)

    def __enter__(self) -> EnvironmentThread:  # `current` for one instance's whole life
        self._token = _CURRENT.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _CURRENT.reset(self._token)
        self.end()

    async def run(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` on the thread. Cancelled, it returns at once; a call already running
        runs on, and the thread's next call waits for it (`busy` meanwhile)."""
        loop = asyncio.get_running_loop()
        answer = loop.create_future()
        self._pending += 1
        self._calls.put((contextvars.copy_context(), fn, answer, loop))
        if not self._started:
            self._started = True
            # _thread's start, not threading's: Thread.start waits until the new thread
            # runs, and with thousands of threads asking for the GIL that wait held the
            # loop for every session (bench/openenv_scaling.py).
            _thread.start_new_thread(self._serve, ())
        return await answer

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            context, fn, answer, loop = call
            result = error = None
            if not answer.cancelled():  # else abandoned before it began: not run
                try:
                    result = context.run(fn)
                except BaseException as exc:  # the caller's to raise
                    error = exc
            try:
                loop.call_soon_threadsafe(self._settle, answer, result, error)
            except RuntimeError:  # the loop has closed: nobody is waiting
                return

    def _settle(self, answer: asyncio.Future[Any], result: Any,
                error: BaseException | None) -> None:
        self._pending -= 1
        if answer.cancelled():
            return
        if error is not None:
            answer.set_exception(error)
        else:
            answer.set_result(result)

    @property
    def busy(self) -> bool:
        """A call has not returned yet (one abandoned by its caller, say)."""
        return self._pending > 0

    def end(self) -> None:
        if not self._ended:
            self._ended = True
            self._calls.put(None)  # the thread exits once the calls before it are done
            _count_thread(-1)


_CURRENT: contextvars.ContextVar[EnvironmentThread | None] = contextvars.ContextVar(
    "synth_deploy_environment_thread", default=None)
_SWITCH_S = 0.005  # CPython's default
# The switch interval per live environment thread (`_switch_interval`): a few times what one
# waiting thread's wakeup costs the core, so that all of them wake well within an interval.
_SWITCH_PER_THREAD_S = 100e-6


_COUNTING = threading.Lock()  # servers of one process may run on loops of their own


def _count_thread(change: int) -> None:
    with _COUNTING:
        EnvironmentThread.live += change
        _switch_interval()


def _switch_interval() -> None:
    """The GIL's switch interval, 100 µs per live environment thread past CPython's 5 ms.

    Each thread waiting for the GIL wakes once an interval to ask for it. When thousands of
    steps end together on one core (OpenEnv sessions, a thread each), the waiters' wakeups
    queue up behind each other; once they take longer than the interval, every waiter is
    due again before its turn comes, they keep the core to themselves, and the loop's thread,
    runnable, got no CPU for half a minute (bench/openenv_scaling.py, 4,096 and 8,192
    sessions at CPython's and at a fifth of this rate). A thread that blocks or waits still
    hands the GIL over at once; only one that computes holds it longer before another's
    turn: 5 ms up to 50 environments, 0.4 s with 4,096 of them alive."""
    sys.setswitchinterval(max(_SWITCH_S, EnvironmentThread.live * _SWITCH_PER_THREAD_S))


async def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``: awaited when async, else on the current environment's thread
    (`EnvironmentThread.current`): an environment's step may hold the CPU, or wait, for a
    while; the server must not."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    thread = _CURRENT.get()
    if thread is None:
        raise RuntimeError(f"{getattr(fn, '__qualname__', fn)} called outside an environment's "
                           "thread (EnvironmentThread.current)")
    result = await thread.run(functools.partial(fn, *args, **kwargs))
    return await result if inspect.isawaitable(result) else result


class EnvironmentSpec:
    """A declared environment: how to make one, and what the kit asks of it."""

    def __init__(self, factory: Callable[[], Any], *, app_id: str, description: str,
                 max_turns: int | None = None) -> None:
        if not callable(factory):
            raise TaskAppError(f"task app {app_id!r}: @task_app.environment takes a class or a "
                               f"factory, got {type(factory).__name__}")
        self.factory = factory
        self.app_id = app_id
        self.description = description
        self.name = getattr(factory, "__name__", app_id)
        self.max_sessions: int | None = getattr(factory, "max_sessions", None)
        # Instances holding a slot, and the episodes waiting for one (`episode_slot`).
        self._live = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._lock = threading.Lock()  # servers of one process may share the spec
        if self.max_sessions is not None and (isinstance(self.max_sessions, bool) or not (
                isinstance(self.max_sessions, int) and self.max_sessions >= 1)):
            raise TaskAppError(f"environment {self.name} of task app {app_id!r}: max_sessions "
                               f"must be a whole number >= 1, got {self.max_sessions!r}")
        if max_turns is not None and not _is_count(max_turns):
            raise TaskAppError(f"environment {self.name} of task app {app_id!r}: max_turns "
                               f"must be a whole number >= 1, got {max_turns!r}")
        self.max_turns = max_turns

    def turn_limit(self, config: Mapping[str, Any]) -> tuple[int, str]:
        """An episode's turn cap and where it comes from: the request's
        ``env.config.max_turns``, else the declared ``max_turns``, else the default."""
        asked = config.get("max_turns")
        if asked is not None:
            if not _is_count(asked):
                raise BadRequest(f"max_turns must be a whole number >= 1, got {asked!r}",
                                 field="env.config.max_turns")
            return asked, "env.config.max_turns"
        if self.max_turns is not None:
            return self.max_turns, "the environment's max_turns"
        return DEFAULT_MAX_TURNS, ("the default cap: the environment states no max_turns "
                                   "(set it on @task_app.environment or TaskApp)")

    # -- instances alive at once: /rollout's episodes and OpenEnv's sessions together ----

    @contextlib.asynccontextmanager
    async def episode_slot(self) -> AsyncIterator[None]:
        """An instance's slot for the block: with ``max_sessions`` taken, a /rollout
        episode waits its turn (first come, first served) rather than failing."""
        await self.wait_for_slot()
        try:
            yield
        finally:
            self.release_slot()

    async def wait_for_slot(self) -> None:
        """`episode_slot`'s taking of a slot, for a holder that gives it back later
        (`release_slot`)."""
        waiter = None
        with self._lock:
            if self.max_sessions is None or (self._live < self.max_sessions
                                             and not self._waiters):
                self._live += 1
            else:
                waiter = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
        if waiter is not None:
            try:
                await waiter  # the slot is handed over with the wake-up
            except asyncio.CancelledError:
                with self._lock:
                    handed = waiter.done() and not waiter.cancelled()
                    if not handed and waiter in self._waiters:
                        self._waiters.remove(waiter)
                if handed:
                    self.release_slot()
                raise

    def take_slot(self) -> bool:
        """An instance's slot if one is free now (OpenEnv's sessions are refused, not
        queued); give it back with `release_slot`."""
        with self._lock:
            if self.max_sessions is not None and (self._live >= self.max_sessions
                                                  or self._waiters):
                return False
            self._live += 1
            return True

    def release_slot(self) -> None:
        with self._lock:
            while self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done():  # the slot goes to it, the count unchanged
                    waiter.get_loop().call_soon_threadsafe(self._hand_over, waiter)
                    return
            self._live -= 1

    def _hand_over(self, waiter: asyncio.Future[None]) -> None:
        if waiter.done():  # cancelled meanwhile: the next in line has it
            self.release_slot()
        else:
            waiter.set_result(None)

    @property
    def live(self) -> int:
        """Instances holding a slot."""
        return self._live

    def new(self) -> Any:
        env = self.factory()
        for method in ("reset", "step"):
            if not callable(getattr(env, method, None)):
                raise TaskAppError(f"environment {self.name} of task app {self.app_id!r} has "
                                   f"no {method}() method")
        return env

    @staticmethod
    def tool(env: Any) -> dict[str, Any]:
        tool = getattr(env, "tool", None)
        tool = tool() if callable(tool) else tool
        if not (isinstance(tool, Mapping) and isinstance(tool.get("function"), Mapping)):
            raise TaskAppError(f"environment {type(env).__name__} declares no tool: set "
                               "`tool = function_tool(name, description, action_schema)`")
        return dict(tool)

    def tools(self, env: Any) -> list[dict[str, Any]]:
        """The tools the policy is offered: the environment's ``tools`` (several, each call
        made an action by its ``action_for(name, arguments)``), else its one ``tool``."""
        many = getattr(env, "tools", None)
        many = many() if callable(many) else many
        return [dict(t) for t in many] if many else [self.tool(env)]

    async def offered(self, env: Any) -> list[dict[str, Any]]:
        """`tools`, on a worker thread only when the environment computes them (an MCP
        environment lists its own): a class attribute costs no thread hop per turn."""
        if callable(getattr(env, "tools", None)):
            return await call(self.tools, env)
        return self.tools(env)

    def action_schema(self, env: Any) -> dict[str, Any]:
        return dict(self.tool(env)["function"].get("parameters") or {"type": "object"})

    async def system_prompt(self, env: Any) -> str:
        if callable(getattr(env, "system_prompt", None)):
            return await call(env.system_prompt)
        names = " or ".join(f"`{t['function']['name']}`" for t in await self.offered(env))
        return f"{self.description}\nAct by calling the {names} tool."


async def reset(env: Any, seed: int | None, *, episode_id: str,
                config: Mapping[str, Any]) -> Step:
    """The environment reset, its first observation as a `Step` (no reward, not done)."""
    keywords = accepted(env.reset, {"episode_id": episode_id, "config": dict(config)})
    first = await call(env.reset, seed, **keywords)
    return first if isinstance(first, Step) else Step(_observation(first))


def accepted(fn: Callable[..., Any], keywords: Mapping[str, Any]) -> dict[str, Any]:
    """``keywords`` but those ``fn`` cannot take (all of them when it takes ``**kwargs``)."""
    # A method's function, read once rather than at each reset (its first parameter is the
    # instance, which no keyword may name).
    function, bound = getattr(fn, "__func__", fn), hasattr(fn, "__func__")
    try:
        names = _keyword_names(function, bound)
    except TypeError:  # an object that cannot be a cache key
        names = _keyword_names.__wrapped__(function, bound)
    return dict(keywords) if names is None else {k: v for k, v in keywords.items()
                                                  if k in names}


@functools.lru_cache(maxsize=256)
def _keyword_names(fn: Callable[..., Any], bound: bool) -> frozenset[str] | None:
    """The names ``fn`` takes by keyword (past its first parameter when ``bound``); None when
    it takes any (``**kwargs``, or a builtin without a signature)."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())[bound:]
    except (TypeError, ValueError):
        return None
    if any(p.kind == p.VAR_KEYWORD for p in parameters):
        return None
    return frozenset(p.name for p in parameters
                     if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def check_action(schema: Mapping[str, Any], action: Mapping[str, Any]) -> None:
    """`InvalidAction` when ``action`` lacks a field ``schema`` requires or has one it
    forbids (the top level of an object schema: what a tool call's arguments are)."""
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    missing = [k for k in schema.get("required") or () if k not in action]
    if missing:
        raise InvalidAction(f"missing required field {missing[0]!r}; the action needs "
                            f"{', '.join(map(repr, schema['required']))}")
    if schema.get("additionalProperties") is False:
        extra = [k for k in action if k not in properties]
        if extra:
            known = ", ".join(map(repr, properties)) or "none"
            raise InvalidAction(f"unknown field {extra[0]!r}: the action schema allows only "
                                f"{known}")


async def step(env: Any, action: Mapping[str, Any]) -> Step:
    tool = getattr(env, "tool", None)
    tool = tool() if callable(tool) else tool
    if isinstance(tool, Mapping) and isinstance(tool.get("function"), Mapping):
        check_action(tool["function"].get("parameters") or {}, action)
    result = await call(env.step, dict(action))
    if not isinstance(result, Step):
        raise TaskAppError(f"{type(env).__name__}.step returned {type(result).__name__}, "
                           "expected a Step")
    result.observation = _observation(result.observation)
    return result


async def close(env: Any) -> None:
    if callable(getattr(env, "close", None)):
        await call(env.close)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _observation(value: Any) -> dict[str, Any]:
    if isinstance(value, Mapping):
        return dict(value)
    return {"text": value} if isinstance(value, str) else {"value": value}


def prompt_of(env: Any, observation: dict[str, Any]) -> Any:
    if callable(getattr(env, "prompt", None)):
        return env.prompt(observation)
    text = observation.get("text")
    return text if isinstance(text, str) else json.dumps(observation, default=str)


def timestep_metadata(env: Any, seed: int | None) -> dict[str, Any]:
    """What the trace says of each step: the environment's ``timestep_metadata`` (read after
    reset: e.g. the seed it chose when none was given), else the requested seed."""
    metadata = getattr(env, "timestep_metadata", None)
    return dict(metadata) if metadata is not None else {"seed": seed}


def text_of(content: Any) -> str:
    """A prompt's text: earlier turns are shown without their images."""
    if isinstance(content, str):
        return content
    return "\n".join(p.get("text", "") for p in content or ()
                     if isinstance(p, Mapping) and p.get("type") == "text")


# -- the episode loop /rollout runs ---------------------------------------------------------------

def from_openenv(env: Callable[[], Any], action_cls: Any, *, tool_name: str | None = None,
                 max_turns: int = DEFAULT_MAX_TURNS, max_sessions: int | None = None,
                 observation_cls: Any = None, state_cls: Any = None,
                 reset_observation_cls: Any = None, env_name: str | None = None,
                 noop: Mapping[str, Any] | None = None) -> type:
    """An environment class wrapping OpenEnv's ``env`` (an ``Environment`` class, or a factory
    of them as OpenEnv's ``create_app`` takes: reset/step/state, pydantic ``Action`` and
    ``Observation``) and ``action_cls``, duck-typed: OpenEnv is needed by the wrapped class,
    never by the kit. Served as OpenEnv's server serves it:

    - ``reset`` gets only the arguments it accepts (``seed`` when one was asked,
      ``episode_id``, the reset's other options);
    - sessions: one at a time unless the class sets ``SUPPORTS_CONCURRENT_SESSIONS``; then
      ``max_sessions`` (default: the server's capacity). More than one for a class that does
      not say it is safe is refused, as OpenEnv's ``create_app`` refuses it (a factory is
      called once to learn its class, as OpenEnv's server does);
    - a ``ValueError`` from ``step`` (the environment refusing the action) is an
      `InvalidAction`: the policy is told, once; over the wire, a validation error;
    - the schemas, as OpenEnv's ``/schema`` has them: the action class's, the observation's
      (``reset_observation_cls`` for a reset's, when it differs) and the state's, from the
      classes given or else the environment's declaration (``Environment[Action,
      Observation, State]``, or ``step``'s and ``state``'s types); without ``state_cls``,
      OpenEnv's own ``State`` (as ``create_app`` publishes it) when the observation derives
      from OpenEnv's ``Observation``.

    An observation is its fields but ``reward`` and ``done`` (as OpenEnv 0.10 serializes it:
    ``metadata`` included, and beside them), the metadata also going to the step's info; each
    step carries OpenEnv's own serialization (`Step.served`) to its wire. An episode the
    environment never ends is cut after ``max_turns`` steps (``env.config.max_turns``) on
    ``/rollout``; on OpenEnv's wire the environment says when it is done. ``noop``: an
    action's fields, played on a turn whose two replies hold no valid action (without it such
    a turn ends the episode). A ``reset`` that takes no seed is noted in each episode's
    details (``seed_ignored``): the same seed cannot repeat its episode."""
    from pydantic_core import PydanticSerializationError

    made = env.func if isinstance(env, functools.partial) else env
    if max_sessions is not None and max_sessions > 1 and not inspect.isclass(made):
        probe = env()  # a factory: its class says whether sessions may run together
        made = type(probe)
        if callable(getattr(probe, "close", None)):
            probe.close()
    concurrent = bool(getattr(made, "SUPPORTS_CONCURRENT_SESSIONS", False))
    label = env_name or getattr(made, "__name__", "the environment")
    if max_sessions is not None and max_sessions > 1 and not concurrent:
        raise TaskAppError(
            f"{label} does not set SUPPORTS_CONCURRENT_SESSIONS = True, so it runs one session "
            f"at a time (as OpenEnv's server runs it), not max_sessions={max_sessions}",
            hint="drop max_sessions, or set SUPPORTS_CONCURRENT_SESSIONS = True on the class "
                 "once its instances share no state")
    mcp = _mcp_actions(action_cls)  # an MCP environment: tools listed and called by step
    schema = _without(dict(action_cls.model_json_schema()), ("metadata",))
    if mcp:  # either action, told apart by its "type" (as OpenEnv's server tells them)
        schema = {"anyOf": [_without(dict(c.model_json_schema()), ("metadata",))
                            for c in mcp.values()]}
    if noop is not None:  # refused now, not on the turn that needs it
        from pydantic import ValidationError

        try:
            (mcp.get(noop.get("type"), action_cls) if mcp else action_cls).model_validate(noop)
        except ValidationError as exc:
            raise TaskAppError(f"noop={dict(noop)!r} is not a valid {action_cls.__name__}: "
                               + "; ".join(f"{'.'.join(map(str, e['loc'])) or 'action'}: "
                                           f"{e['msg']}" for e in exc.errors(include_url=False)),
                               hint=f"give noop the fields of a {action_cls.__name__} "
                                    "(the action) the environment accepts on any turn"
                               ) from None
    name = tool_name or _snake(action_cls.__name__)
    description = (action_cls.__doc__ or f"Take a {action_cls.__name__}.").strip().split("\n")[0]
    from synth_deploy.taskapp.tools import function_tool

    class OpenEnvEnvironment:
        tool = function_tool(name, description, schema)
        action_schema = dict(action_cls.model_json_schema())

        def __init__(self) -> None:
            self.env = env()
            self.turns, self.limit = 0, max_turns
            self.seed_ignored: str | None = None
            self._listed: list[dict[str, Any]] | None = None

        # What OpenEnv's /schema publishes: read off the instance, for a factory's class.
        @property
        def observation_schema(self) -> dict[str, Any] | None:
            return _model_schema(self._declared("observation", observation_cls))

        @property
        def reset_observation_schema(self) -> dict[str, Any] | None:
            return _model_schema(reset_observation_cls) or self.observation_schema

        @property
        def state_schema(self) -> dict[str, Any] | None:
            # create_app's default: OpenEnv's own State, whatever the environment declares.
            default = _openenv_state(self._declared("observation", observation_cls))
            return _model_schema(state_cls or default or self._declared("state", None))

        def _declared(self, key: str, given: Any) -> Any:
            return given or _declared_models(type(self.env)).get(key)

        def reset(self, seed: int | None, *, episode_id: str, config: dict[str, Any]) -> Step:
            options = dict(config)
            self.limit = int(options.pop("max_turns", max_turns))
            self.turns = 0
            asked = {**({"seed": seed} if seed is not None else {}), "episode_id": episode_id,
                     **options}
            given = accepted(self.env.reset, asked)
            self.seed_ignored = (f"{label}.reset() takes no seed, so seed {seed} was not "
                                 "passed" if seed is not None and "seed" not in given else None)
            return self._step(self.env.reset(**given))

        def step(self, action: dict[str, Any]) -> Step:
            from pydantic import ValidationError

            typed_as = mcp.get(action.get("type"), action_cls) if mcp else action_cls
            try:
                typed = typed_as.model_validate(action)
            except ValidationError as exc:
                raise InvalidAction("; ".join(
                    f"{'.'.join(map(str, e['loc'])) or 'action'}: {e['msg']}"
                    for e in exc.errors(include_url=False))) from None
            try:
                observation = self.env.step(typed)
            except ValueError as exc:  # OpenEnv's environments refuse an action this way
                raise InvalidAction(f"{label} refused the action: {exc}") from exc
            self.turns += 1
            result = self._step(observation)
            if not result.done and self.turns >= self.limit:
                result.done = result.truncated = True
            return result

        def tools(self) -> list[dict[str, Any]]:
            """An MCP environment's own tools, as the policy's functions (listed once)."""
            if not mcp:
                return []
            if self._listed is None:
                listed = self.mcp("tools/list", {})["tools"]
                self._listed = [function_tool(
                    t["name"], t.get("description") or t["name"],
                    t.get("input_schema") or t.get("inputSchema") or {"type": "object"})
                    for t in listed if isinstance(t, dict) and t.get("name")]
            return self._listed

        def action_for(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
            if not mcp:
                return arguments
            return {"type": "call_tool", "tool_name": name, "arguments": arguments}

        def mcp(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
            """A JSON-RPC MCP method's result, run as OpenEnv's server runs it for an
            environment whose actions are MCP's: as a step."""
            if method == "tools/list":
                listed = self.env.step(mcp["list_tools"]())
                return {"tools": json.loads(json.dumps(list(getattr(listed, "tools", ())),
                                                       default=_plain))}
            name = params.get("name")
            if not isinstance(name, str) or not name:
                raise InvalidAction("tools/call needs params.name, the tool's name")
            called = self.env.step(mcp["call_tool"](tool_name=name,
                                                    arguments=params.get("arguments") or {}))
            if (failed := getattr(called, "error", None)) is not None:
                raise InvalidAction(f"tool {name!r} failed: "
                                    f"{getattr(failed, 'message', failed)}")
            # The tool's own result, as OpenEnv's server answers through its MCP client.
            return json.loads(json.dumps(getattr(called, "result", None), default=_plain))

        def state(self) -> dict[str, Any]:
            state = self.env.state
            state = state() if callable(state) else state
            return state.model_dump() if hasattr(state, "model_dump") else dict(state or {})

        def close(self) -> None:
            self.env.close()

        @staticmethod
        def _step(observation: Any) -> Step:
            # OpenEnv's serialize_observation, as JSON values: pydantic's own JSON mode, or
            # through JSON for what it cannot make JSON (an MCP tool's result object).
            try:
                fields = observation.model_dump(mode="json", exclude={"reward", "done"})
            except PydanticSerializationError:
                fields = json.loads(json.dumps(observation.model_dump(
                    exclude={"reward", "done"}), default=_plain))
            served = {"observation": fields, "reward": observation.reward,
                      "done": observation.done}
            if observation.metadata:
                served["metadata"] = fields.get("metadata", observation.metadata)
            return Step(served["observation"], reward=float(observation.reward or 0.0),
                        done=bool(observation.done), info=dict(served.get("metadata") or {}),
                        served=served)

    OpenEnvEnvironment.max_sessions = max_sessions if concurrent else 1
    if noop is not None:
        OpenEnvEnvironment.noop = dict(noop)
    if not mcp:
        OpenEnvEnvironment.mcp = None  # /mcp answers as for an environment without tools
    OpenEnvEnvironment.__name__ = OpenEnvEnvironment.__qualname__ = env_name or getattr(
        made, "__name__", "OpenEnvEnvironment")
    return OpenEnvEnvironment


def _mcp_actions(action_cls: Any) -> dict[str, Any]:
    """OpenEnv's MCP actions by their ``type`` ("list_tools", "call_tool") when
    ``action_cls`` is one of them (read from its own module: the kit never imports openenv)."""
    import sys

    module = sys.modules.get(getattr(action_cls, "__module__", ""), None)
    found = {"list_tools": getattr(module, "ListToolsAction", None),
             "call_tool": getattr(module, "CallToolAction", None)}
    return found if action_cls in found.values() and all(found.values()) else {}


def _openenv_state(observation_cls: Any) -> Any:
    """OpenEnv's ``State``, read from the module of the ``Observation`` an observation class
    derives from (the kit never imports openenv); None for a class not derived from it."""
    import sys

    for base in getattr(observation_cls, "__mro__", ()):
        if base.__name__ == "Observation":
            return getattr(sys.modules.get(base.__module__), "State", None)
    return None


def _plain(value: Any) -> Any:
    """A JSON-ready form of what an observation holds beyond JSON (a tool's result object)."""
    if callable(getattr(value, "model_dump", None)):
        return value.model_dump()
    if hasattr(value, "__dict__"):
        return {k: v for k, v in vars(value).items() if not k.startswith("_")}
    return str(value)


def _declared_models(env_cls: Any) -> dict[str, Any]:
    """The observation and state classes ``env_cls`` declares: ``Environment[A, O, S]``'s
    arguments, else the return types of ``step`` and ``state``."""
    import typing

    found: dict[str, Any] = {}
    for base in getattr(env_cls, "__orig_bases__", ()):
        args = typing.get_args(base)
        if len(args) == 3:
            found.update(observation=args[1], state=args[2])
    for key, member in (("observation", "step"), ("state", "state")):
        if _is_model(found.get(key)):
            continue
        attr = getattr(env_cls, member, None)
        fn = attr.fget if isinstance(attr, property) else attr
        try:
            found[key] = typing.get_type_hints(fn).get("return")
        except Exception:  # an annotation that cannot be resolved: no schema, not a failure
            found.pop(key, None)
    return {k: v for k, v in found.items() if _is_model(v)}


def _is_model(value: Any) -> bool:
    return isinstance(value, type) and callable(getattr(value, "model_json_schema", None))


def _model_schema(model: Any) -> dict[str, Any] | None:
    return dict(model.model_json_schema()) if _is_model(model) else None


def _without(schema: dict[str, Any] | None, names: Sequence[str]) -> dict[str, Any] | None:
    if schema is None:
        return None
    schema["properties"] = {k: v for k, v in schema.get("properties", {}).items()
                            if k not in names}
    if "required" in schema:
        schema["required"] = [k for k in schema["required"] if k not in names]
    return schema


def _snake(name: str) -> str:
    name = name.removesuffix("Action") or name
    return "".join(f"_{c.lower()}" if c.isupper() and i else c.lower()
                   for i, c in enumerate(name))


__all__ = ["DEFAULT_MAX_TURNS", "EnvironmentSpec", "EnvironmentThread", "Outcome", "Reward", "Step",
           "accepted", "call", "check_action", "close", "from_openenv", "prompt_of", "reset",
           "step", "text_of", "timestep_metadata"]
