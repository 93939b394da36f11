"""`TaskApp`: a task app declared once, at the top of its file, the way a Modal app is.

    task_app = TaskApp("math", name="Arithmetic", description="...", datasets=[DATASET],
                       rubrics=RUBRICS, modal=ModalSettings(name="synth-math"))

    @task_app.instances
    def instances(seeds): ...           # seeds -> TaskInfo (optional)

    @task_app.rollout
    async def rollout(request, ctx): ...  # one episode; record the reward with ctx.tracer

    @task_app.environment                 # or: reset/step, and the kit derives the rollout
    class Game: ...                       # (see `_environment`); served on OpenEnv's wire too

    @task_app.scorer(stateless=True)      # optional: a stored episode scored again
    def score(session): ...               # (`synth-deploy traces rescore`, see `scoring`)

    app = modal_app(__file__)             # the `modal deploy` entry

Declaring registers it (by id, for `synth-deploy serve ID`); `build_config()` turns the
declaration into the `TaskAppConfig` the server runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from synth_deploy.errors import TaskAppError
from synth_deploy.taskapp._environment import DEFAULT_MAX_TURNS, EnvironmentSpec, from_openenv
from synth_deploy.taskapp._episode import episode_rollout
from synth_deploy.taskapp.config import (
    RolloutExecutor,
    RubricBundle,
    TaskAppConfig,
    TaskDataset,
    TaskDatasetRegistry,
)
from synth_deploy.taskapp.contracts import LimitsInfo, TaskDescriptor, TaskInfo
from synth_deploy.taskapp.registry import TaskAppEntry, add_entry, caller_file
from synth_deploy.taskapp.scoring import ScoreFunction, Scorer, scorer_decorator

# create_app's arguments for OpenEnv's web interface, which the kit does not serve.
_WEB_INTERFACE = frozenset({"gradio_builder", "custom_tab_name", "custom_tab_primary",
                            "show_default_tab", "title_override"})


class TaskApp:
    """A task app's identity, datasets, rubrics and deployment settings, stated once."""

    def __init__(self, app_id: str, *, name: str, description: str, version: str = "1",
                 datasets: Sequence[TaskDataset] = (), rubrics: RubricBundle = RubricBundle(),
                 limits: LimitsInfo | None = None, environment: str | None = None,
                 modal: Any = None, max_turns: int | None = None, **settings: Any) -> None:
        """``max_turns``: the turn cap of the app's environment when its decorator states
        none (default `DEFAULT_MAX_TURNS`). ``settings`` are the rest of `TaskAppConfig`
        (proxy, routers, startup_hooks, app_state, max_body_bytes, max_rollout_seconds...)."""
        self.max_turns = max_turns
        self.app_id, self.name, self.description, self.version = (
            app_id, name, description, version)
        self.datasets = tuple(datasets)
        self.rubrics = rubrics
        self.settings = settings
        dataset_info = self.datasets[0].to_info() if self.datasets else None
        self.task_info = TaskInfo(
            task=TaskDescriptor(id=app_id, name=name, version=version, description=description),
            environment=environment or app_id, rubric=rubrics.to_info(),
            limits=limits or LimitsInfo(), **({"dataset": dataset_info} if dataset_info else {}))
        self._rollout: RolloutExecutor | None = None
        self._instances: Callable[[Sequence[int]], Iterable[TaskInfo]] | None = None
        self._taskset: Callable[[], Mapping[str, Any]] | None = None
        self._environment: EnvironmentSpec | None = None
        self._scorer: Scorer | None = None
        self.entry: TaskAppEntry = add_entry(TaskAppEntry(
            app_id, self.build_config, description, modal, caller_file(1)))

    def rollout(self, fn: RolloutExecutor) -> RolloutExecutor:
        """Decorator: the episode function ``(request, ctx) -> result`` (sync or async)."""
        self._rollout = fn
        return fn

    def environment(self, factory: Callable[[], Any] | None = None, *,
                    max_turns: int | None = None) -> Any:
        """Decorator: the app's environment, a class (or factory) whose instances reset with
        a seed and step with an action (`synth_deploy.taskapp.Step`). Without
        ``@task_app.rollout`` the kit derives the episode loop from it; either way the app is
        also served on OpenEnv's wire (``/openenv``). ``@task_app.environment(max_turns=N)``
        caps its episodes at N steps (else the app's ``max_turns``, else
        `DEFAULT_MAX_TURNS`); a request's ``env.config.max_turns`` overrides it."""
        def declare(factory: Callable[[], Any]) -> Callable[[], Any]:
            self._environment = EnvironmentSpec(
                factory, app_id=self.app_id, description=self.description,
                max_turns=self.max_turns if max_turns is None else max_turns)
            return factory

        return declare if factory is None else declare(factory)

    def openenv(self, env: Callable[[], Any], action_cls: Any, observation_cls: Any = None,
                env_name: str | None = None, max_concurrent_envs: int | None = None,
                concurrency_config: Any = None, *, state_cls: Any = None,
                reset_observation_cls: Any = None, tool_name: str | None = None,
                max_turns: int | None = None, max_sessions: int | None = None,
                noop: Mapping[str, Any] | None = None, **web_interface: Any) -> None:
        """Declare an OpenEnv environment as this app's environment, with the arguments
        OpenEnv's ``create_app`` takes (``env``: its ``Environment`` class, or a factory such
        as an ``app.py``'s ``create_..._environment``, served as it builds the environment):
        served, traced and trained on like any other (see `from_openenv`).

        ``max_concurrent_envs`` (or ``concurrency_config.max_concurrent_envs``, or
        ``max_sessions``): sessions held at once, for a class that supports concurrent
        sessions (one at a time otherwise). ``create_app``'s web-interface arguments
        (``gradio_builder``, ``custom_tab_name``...) are accepted and unused: the kit serves
        no ``/web``; idle sessions close after the app's ``session_idle_seconds``.
        ``max_turns``: as `environment`'s; ``noop``: an action's fields, played on a turn whose
        replies hold no valid action (without it, such a turn ends the episode)."""
        unknown = sorted(set(web_interface) - _WEB_INTERFACE)
        if unknown:
            raise TaskAppError(f"task_app.openenv() got an unexpected argument {unknown[0]!r}",
                               hint="it takes what OpenEnv's create_app takes (env, action_cls, "
                                    "observation_cls, env_name, max_concurrent_envs, "
                                    "concurrency_config, state_cls, reset_observation_cls) and "
                                    "tool_name, max_turns, max_sessions")
        sessions = [n for n in (max_sessions, max_concurrent_envs,
                                getattr(concurrency_config, "max_concurrent_envs", None))
                    if n is not None]
        if len(set(sessions)) > 1:
            raise TaskAppError(f"task app {self.app_id!r}: the session counts given disagree "
                               f"({', '.join(map(str, sessions))})",
                               hint="give one of max_sessions, max_concurrent_envs or "
                                    "concurrency_config")
        cap = next((n for n in (max_turns, self.max_turns) if n is not None), DEFAULT_MAX_TURNS)
        self.environment(from_openenv(
            env, action_cls, tool_name=tool_name, max_turns=cap,
            max_sessions=sessions[0] if sessions else None, observation_cls=observation_cls,
            state_cls=state_cls, reset_observation_cls=reset_observation_cls,
            env_name=env_name, noop=noop), max_turns=cap)

    def scorer(self, fn: ScoreFunction | None = None, *, stateless: bool = True,
               reason: str | None = None) -> Any:
        """Decorator: how an episode is scored from its stored trace, ``(session) -> reward``
        (a `synth_deploy.tracing.SessionTrace`; None when it cannot say), for `synth-deploy
        traces rescore`. ``stateless=False`` (with the ``reason``: what the trace does not
        keep) makes a rescore refuse unless forced. Use bare (``@task_app.scorer``) or
        called (``@task_app.scorer(stateless=False, reason="...")``)."""
        def declare(scorer: Scorer) -> None:
            self._scorer = scorer

        decorate = scorer_decorator(stateless, reason, declare)
        return decorate(fn) if fn is not None else decorate

    def instances(self, fn: Callable[[Sequence[int]], Iterable[TaskInfo]]
                  ) -> Callable[[Sequence[int]], Iterable[TaskInfo]]:
        """Decorator: seeds -> task instances for `/task_info?seed=N` (default: the app's
        task info with ``{"seed": N}`` as metadata)."""
        self._instances = fn
        return fn

    def taskset(self, fn: Callable[[], Mapping[str, Any]]) -> Callable[[], Mapping[str, Any]]:
        """Decorator: what `/task_info` without seeds describes (default: id, name, text)."""
        self._taskset = fn
        return fn

    def instance(self, seed: int, **metadata: Any) -> TaskInfo:
        """This app's task info for one seed (a copy, ready for per-seed changes)."""
        info = self.task_info.model_copy(deep=True)
        info.task_metadata = {"seed": seed, **metadata}
        return info

    def build_config(self) -> TaskAppConfig:
        rollout = self._rollout
        if rollout is None and self._environment is not None:
            rollout = episode_rollout(self._environment)
        if rollout is None:
            raise TaskAppError(f"task app {self.app_id!r} declares no rollout",
                               hint="decorate its episode function with @task_app.rollout, "
                                    "or its environment with @task_app.environment")
        settings = dict(self.settings)
        if settings.get("sandbox") is not None:
            from synth_deploy.sandbox import lifecycle_hooks

            start, end = lifecycle_hooks(self.app_id)
            settings["startup_hooks"] = (start, *settings.get("startup_hooks", ()))
            settings["shutdown_hooks"] = (end, *settings.get("shutdown_hooks", ()))
        return TaskAppConfig(
            app_id=self.app_id, name=self.name, description=self.description,
            version=self.version, base_task_info=self.task_info, rollout=rollout,
            environment=self._environment,
            provide_task_instances=self._instances or (
                lambda seeds: [self.instance(seed) for seed in seeds]),
            describe_taskset=self._taskset, rubrics=self.rubrics, scorer=self._scorer,
            dataset_registry=TaskDatasetRegistry(self.datasets), **settings)

    def __repr__(self) -> str:
        return f"TaskApp({self.app_id!r}, source={self.entry.source})"


__all__ = ["TaskApp"]
