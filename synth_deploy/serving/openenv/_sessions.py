"""Environment sessions held for OpenEnv's clients: a lease each, a capacity, a trace per episode.

A session is one environment instance a client drives step by step (a WebSocket connection,
or a run of HTTP calls naming it). Unlike OpenEnv's own server, whose idle reaper is off by
default (sessions pile up until it answers ``CAPACITY_REACHED`` for good, OpenEnv#1000):

- **a lease**: a session nobody has used for the app's ``session_idle_seconds`` is closed by
  the reaper, its episode traced as incomplete; a step still running keeps it alive;
- **capacity**: at most ``capacity`` sessions at once; the next is refused at once with a
  retry hint (`AtCapacity`), never queued; the count is advertised. An HTTP session holds
  its slot only while a call runs (OpenEnv's HTTP calls hold none): a new session at
  capacity takes the slot of the least recently used idle HTTP session;
- **traces**: each episode (a reset and the steps after it) is one session in the trace
  store, like a rollout: its steps, rewards and outcome; finished (``ok``) or, when the
  client reset again, closed or vanished first, an ``error`` that says which.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from synth_deploy.errors import BadRequest
from synth_deploy.serving._failures import AppFailures
from synth_deploy.taskapp import _environment as environment
from synth_deploy.taskapp._environment import (
    EnvironmentSpec,
    EnvironmentThread,
    Outcome,
    Step,
)
from synth_deploy.taskapp.contracts import RolloutStep
from synth_deploy.tracing import SessionTrace, SessionTracer

logger = logging.getLogger("synth_deploy.taskapp")

RETRY_AFTER_S = 1


class AtCapacity(Exception):
    """Every session slot is taken: retry after `RETRY_AFTER_S`."""

    def __init__(self, active: int, capacity: int) -> None:
        super().__init__(f"the app holds its maximum of {capacity} environment sessions; "
                         f"retry in {RETRY_AFTER_S} s")
        self.active, self.capacity = active, capacity


class SessionGone(LookupError):
    """The session was closed (by its client, or by the reaper after its lease ran out)."""


@dataclass
class _Episode:
    episode_id: str
    seed: int | None
    started: float  # perf_counter, for its duration
    created_at: float = field(default_factory=time.time)
    # Each step as it came: (number, time, action, result, timestep metadata). The trace is
    # built from them once the episode ends, when it is written: a step answers sooner.
    turns: list[tuple[int, float, Mapping[str, Any], Step, dict[str, Any]]] = field(
        default_factory=list)
    done: bool = False


@dataclass(eq=False)
class EnvSession:
    """One client's environment: used by one request at a time (``lock``)."""

    id: str
    transport: str  # "ws", "http", or "mcp" (made by JSON-RPC, a WebSocket may attach)
    env: Any
    thread: EnvironmentThread  # where the environment was made, and its sync calls run
    last_used: float
    on_reap: Callable[[], None] | None = None  # how a WebSocket is told its lease ran out
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    busy: int = 0
    step_count: int = 0
    episode: _Episode | None = None
    closed: bool = False


class _InUse:
    """``async with``: ``session`` used by this request alone (its lock), its sync calls on its
    thread, its lease renewed when done; `SessionGone` once it is closed. A class, not a
    generator: every step passes through it."""

    __slots__ = ("sessions", "session", "current")

    def __init__(self, sessions: EnvSessions, session: EnvSession) -> None:
        self.sessions, self.session = sessions, session

    async def __aenter__(self) -> None:
        session = self.session
        if session.closed:
            raise SessionGone(session.id)
        session.busy += 1  # a long step is not idleness
        try:
            await session.lock.acquire()
        except BaseException:
            self._done()
            raise
        if session.closed:
            session.lock.release()
            self._done()
            raise SessionGone(session.id)
        self.current = session.thread.current()
        self.current.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.current.__exit__()
        self.session.lock.release()
        self._done()

    def _done(self) -> None:
        session = self.session
        session.busy -= 1
        session.last_used = asyncio.get_running_loop().time()
        http = self.sessions._http
        if session.id in http:  # the most recently used last: the last to yield its slot
            http[session.id] = http.pop(session.id)


class EnvSessions:
    """The environment sessions of one served app."""

    def __init__(self, spec: EnvironmentSpec, *, app_id: str, capacity: int, idle_s: float,
                 failures: AppFailures, trace_store: Any = None,
                 on_session: Callable[[SessionTrace], None] | None = None,
                 identity: Mapping[str, str] | None = None) -> None:
        self.spec, self.app_id, self.failures = spec, app_id, failures
        self.identity = dict(identity or {})  # which code of the app: in every session
        self.capacity, self.idle_s = capacity, idle_s
        self.trace_store, self.on_session = trace_store, on_session
        self.sessions: dict[str, EnvSession] = {}
        self._http: dict[str, EnvSession] = {}  # HTTP sessions, least recently used first
        self.reserved = 0  # slots taken by sessions whose environment is being made
        self._sweeping: asyncio.AbstractEventLoop | None = None
        self._closing: set[asyncio.Task[None]] = set()

    def snapshot(self) -> dict[str, Any]:
        return {"active_sessions": len(self.sessions), "max_sessions": self.capacity,
                "idle_timeout_s": self.idle_s}

    async def open(self, transport: str, *, on_reap: Callable[[], None] | None = None
                   ) -> EnvSession:
        """A new session (`AtCapacity` when every slot is taken by a session in use). An HTTP
        session between its calls gives its slot up to a new one, oldest first: OpenEnv's HTTP
        calls hold no slot, so no HTTP client locks out a WebSocket one."""
        while True:
            active = len(self.sessions) + self.reserved
            # /rollout's episodes hold the environment's own cap too (`take_slot`).
            if active < self.capacity and self.spec.take_slot():
                break
            idle = next((s for s in self._http.values() if not s.busy), None)
            if idle is None:
                if active >= self.capacity:
                    raise AtCapacity(active, self.capacity)
                raise AtCapacity(self.spec.live, self.spec.max_sessions or self.capacity)
            await self.close(idle, "a new session took its slot (an HTTP session holds one "
                                   "only while a call runs)")
        self.reserved += 1
        thread = EnvironmentThread()
        try:
            with thread.current():
                env = await environment.call(self.spec.new)
        except BaseException:
            thread.end()
            self.spec.release_slot()
            raise
        finally:
            self.reserved -= 1
        loop = asyncio.get_running_loop()
        session = EnvSession(uuid.uuid4().hex, transport, env, thread, loop.time(), on_reap)
        self.sessions[session.id] = session
        if transport == "http":
            self._http[session.id] = session
        if self._sweeping is not loop:
            self._sweeping = loop
            loop.call_later(self._interval, self._sweep, loop)
        return session

    def get(self, session_id: str) -> EnvSession:
        session = self.sessions.get(session_id)
        if session is None:
            raise SessionGone(session_id)
        return session

    async def reset(self, session: EnvSession, seed: int | None, episode_id: str | None,
                    config: Mapping[str, Any]) -> Step:
        async with self._using(session):
            if session.episode is not None:
                await self._end_episode(session, "the client reset the environment")
            episode = _Episode(episode_id or uuid.uuid4().hex, seed, time.perf_counter())
            first = await environment.reset(session.env, seed, episode_id=episode_id,
                                            config=config)
            session.episode, session.step_count = episode, 0
            episode.done = first.done
            return first

    async def step(self, session: EnvSession, action: Mapping[str, Any]) -> Step:
        async with self._using(session):
            episode = session.episode
            # Listing an MCP environment's tools changes nothing: allowed before a reset.
            listing = callable(getattr(session.env, "mcp", None)) and \
                action.get("type") == "list_tools"
            if episode is None and not listing:
                raise BadRequest("step before reset: this session has no episode yet; send "
                                 "reset first (its answer is the first observation)",
                                 status=409, code="reset_first")
            result = await environment.step(session.env, action)
            session.step_count += 1
            if episode is not None and not episode.done:
                episode.turns.append((session.step_count, time.time(), action, result,
                                      environment.timestep_metadata(session.env, episode.seed)))
                if result.done:
                    episode.done = True
                    await self._write(episode, session, None)
            return result

    async def mcp(self, session: EnvSession, method: str, params: Mapping[str, Any]
                  ) -> dict[str, Any]:
        """An MCP method (``tools/list``, ``tools/call``) run by the session's environment."""
        async with self._using(session):
            return await environment.call(session.env.mcp, method, dict(params))

    async def state(self, session: EnvSession) -> dict[str, Any]:
        async with self._using(session):
            extra = {}
            if callable(getattr(session.env, "state", None)):
                extra = dict(await environment.call(session.env.state) or {})
            episode = session.episode  # the environment's own fields win: its step_count
            return {"episode_id": episode.episode_id if episode else None,
                    "step_count": session.step_count, **extra}

    async def close(self, session: EnvSession, reason: str) -> None:
        """End ``session``: its episode traced, its environment closed, its slot free."""
        if session.closed:
            return
        session.closed = True
        self.sessions.pop(session.id, None)
        self._http.pop(session.id, None)
        with session.thread.current():
            try:
                if session.episode is not None:
                    await self._end_episode(session, reason)
            finally:
                try:
                    await environment.close(session.env)
                except Exception as exc:  # a failing close must not keep the slot
                    self.failures.error(exc, "closing environment session %s failed",
                                        session.id)
                finally:
                    session.thread.end()
                    self.spec.release_slot()

    async def close_all(self) -> None:
        for session in list(self.sessions.values()):
            await self.close(session, "the server stopped")

    # -- the lease -----------------------------------------------------------------------------

    @property
    def _interval(self) -> float:
        return min(max(self.idle_s / 4, 0.05), 5.0)

    def _using(self, session: EnvSession) -> _InUse:
        return _InUse(self, session)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._sweeping is not loop:
            return
        if not self.sessions:
            self._sweeping = None
            return
        expired = loop.time() - self.idle_s
        for session in list(self.sessions.values()):
            if not session.busy and session.last_used <= expired:
                task = loop.create_task(self._reap(session))
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
        loop.call_later(self._interval, self._sweep, loop)

    async def _reap(self, session: EnvSession) -> None:
        logger.info("environment session %s idle for %g s: closed", session.id, self.idle_s)
        if session.on_reap is not None:  # its socket is closed first: once the slot shows
            session.on_reap()  # free, a client's next message meets the close, not an error
        await self.close(session, f"idle for {self.idle_s:g} s: the lease ran out")

    # -- the trace ------------------------------------------------------------------------------

    @staticmethod
    def _traced(episode: _Episode) -> tuple[SessionTracer, list[RolloutStep]]:
        """The episode's steps recorded in a tracer (at the times they came), and as the
        steps an environment's ``outcome`` reads. A reward that is not a finite number (a
        scorer that divided by zero) is recorded as its client read it, null, and the
        event's metadata says what it was (``rewards_not_finite``)."""
        tracer, steps = SessionTracer(metadata={}), []
        tracer.session.created_at = episode.created_at
        timesteps, unfit_steps = [], []
        for number, at, action, result, metadata in episode.turns:
            timestep = tracer.start_timestep(f"step-{number}", turn_number=number,
                                             metadata=metadata)
            timestep.timestamp = at
            timesteps.append(timestep)
            tracer.record_message("user", {"action": dict(action)}).timestamp = at
            info = dict(result.info)
            reward = float(result.reward)
            unfit = {name: repr(value) for name, value in
                     [("reward", reward), *((r.kind, r.value) for r in result.rewards)]
                     if not math.isfinite(value)}
            reward = reward if "reward" not in unfit else None
            if unfit:
                unfit_steps.append(number)
            event = tracer.record_environment_event(
                reward=reward, terminated=result.done and not result.truncated,
                truncated=result.truncated, state_after=result.state,
                metadata={**info, "action": dict(action),
                          **({"rewards_not_finite": unfit} if unfit else {})})
            event.event_time = at
            for r in result.rewards:
                if math.isfinite(r.value):
                    tracer.record_event_reward(r.value, reward_type=r.kind,
                                               source="environment", turn_number=number,
                                               event_id=event.id,
                                               annotation=r.annotation).created_at = at
            steps.append(RolloutStep(obs=result.observation, reward=reward, done=result.done,
                                     truncated=result.truncated, info=info))
        for timestep, following in itertools.pairwise(timesteps):  # until the next came
            timestep.completed_at = following.timestamp
        if unfit_steps:  # once an episode: an environment that divides by zero does it often
            logger.warning("episode %s: %d step(s) gave a reward that is not a finite number "
                           "(first: step %d); recorded as null, as its client read it",
                           episode.episode_id, len(unfit_steps), unfit_steps[0])
        return tracer, steps

    async def _end_episode(self, session: EnvSession, reason: str) -> None:
        episode, session.episode = session.episode, None
        if episode is not None and not episode.done:
            await self._write(episode, session, reason)

    async def _write(self, episode: _Episode, session: EnvSession, unfinished: str | None
                     ) -> None:
        """The episode as a traced session: ``unfinished`` says why it ended before done.
        Nothing when nobody reads it (no store, no live export)."""
        if self.trace_store is None and self.on_session is None:
            return
        tracer, steps = self._traced(episode)
        bad_outcome = None
        if unfinished is None:
            if callable(getattr(session.env, "outcome", None)):
                outcome = await environment.call(session.env.outcome, steps)
            else:
                outcome = Outcome(reward=sum(s.reward or 0.0 for s in steps))
            total = float(outcome.reward)  # not a number at all: the app's own error
            if not math.isfinite(total):  # the episode is kept, as a failure
                bad_outcome = (f"the environment's outcome reward must be a finite number, "
                               f"got {total!r} (a division by zero in its outcome?)")
                logger.warning("episode %s: %s; stored with status error", episode.episode_id,
                               bad_outcome)
            else:
                tracer.record_outcome_reward(total, achievements_count=outcome.achievements,
                                             total_steps=len(steps),
                                             metadata=dict(outcome.metadata))
        trace = tracer.finish()
        rewards = [s.reward or 0.0 for s in steps]
        trace.metadata = {
            "app_id": self.app_id, **self.identity, "run_id": episode.episode_id,
            "mode": "openenv",
            "seed": episode.seed, "model": None, "env_name": self.spec.name,
            "transport": f"openenv-{session.transport}", "openenv_session": session.id,
            **trace.metadata, "duration_s": round(time.perf_counter() - episode.started, 6),
            "status": "ok" if unfinished is None and bad_outcome is None else "error",
            "metrics": {"outcome_reward": trace.outcome_rewards[-1].total_reward
                        if trace.outcome_rewards else None if bad_outcome else sum(rewards),
                        "num_steps": len(steps), "episode_rewards": rewards}}
        if unfinished is not None:
            trace.metadata["error"] = {"code": "episode_unfinished",
                                       "message": f"the episode ended before done: {unfinished}"}
        elif bad_outcome is not None:
            trace.metadata["error"] = {"code": "reward_not_finite", "message": bad_outcome}
        if self.on_session is not None:
            try:
                self.on_session(trace)
            except Exception as exc:  # spans are a view of the episode: they never fail it
                self.failures.error(exc, "live export of episode %s failed",
                                    episode.episode_id)
        if self.trace_store is not None:
            try:
                await self.trace_store.write_session(trace)
            except Exception as exc:  # a full disk fails every episode: said once, counted
                self.failures.error(exc, "trace write failed for episode %s", episode.episode_id)
                if unfinished is None:
                    raise


__all__ = ["AtCapacity", "EnvSession", "EnvSessions", "RETRY_AFTER_S", "SessionGone"]
