"""How a task app is declared: `TaskAppConfig` and the small value objects around it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from synth_deploy.taskapp._identity import AppIdentity
from synth_deploy.taskapp.contracts import (
    DatasetInfo,
    RolloutRequest,
    RolloutResponse,
    RubricInfo,
    RubricSection,
    TaskInfo,
)

if TYPE_CHECKING:
    from synth_deploy.sandbox import Sandbox, SandboxSettings
    from synth_deploy.taskapp._environment import EnvironmentSpec
    from synth_deploy.taskapp._outbound import OutboundClient
    from synth_deploy.taskapp.scoring import Scorer
    from synth_deploy.tracing import SessionTracer

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_ROLLOUT_SECONDS = 3600.0
DEFAULT_MAX_SEEDS_PER_REQUEST = 1000
# An environment session (OpenEnv's wire) nobody used for this long is closed: long enough for
# a large model's turn, short enough that a vanished client's slot comes back.
DEFAULT_SESSION_IDLE_SECONDS = 300.0


@dataclass(frozen=True)
class TaskDataset:
    """One dataset a task app advertises: ids and URLs only, assets are fetched on demand.

    ``seeds`` (a ``range``, or any container of ints) are the seeds it has: when the app's
    datasets declare them, a rollout or `/task_info` for any other seed is refused (422/404)
    before the app's code runs. ``split_seeds``: the seeds of each split, where a dataset has
    more than one (what synth-containers' clients count and page through).
    """

    id: str
    display_name: str | None = None
    description: str | None = None
    version: str | None = None
    splits: Sequence[str] = ("train",)
    default_split: str | None = None
    default_seeds: Mapping[str, Sequence[int]] = field(default_factory=dict)
    storage_uri: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    seeds: Sequence[int] | None = None
    split_seeds: Mapping[str, Sequence[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if unknown := [s for s in self.split_seeds if s not in self.splits]:
            raise ValueError(f"TaskDataset {self.id!r}: split_seeds names {unknown}, which "
                             f"splits={list(self.splits)} lacks; add them to splits or fix "
                             "the names")

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.display_name or self.id,
            "display_name": self.display_name or self.id,
            "description": self.description,
            "version": self.version,
            "splits": list(self.splits),
            "default_split": self.default_split or (self.splits[0] if self.splits else None),
            "default_seeds": {k: list(v) for k, v in self.default_seeds.items()},
            "storage_uri": self.storage_uri,
            "metadata": dict(self.metadata),
        }

    def to_info(self) -> DatasetInfo:
        d = self.to_dict()
        return DatasetInfo(
            id=d["id"], name=d["name"], version=d["version"], splits=d["splits"],
            default_split=d["default_split"], description=d["description"],
        )


class TaskDatasetRegistry:
    """The datasets a task app offers, advertised through `/task_info` and `/info`."""

    def __init__(self, datasets: Iterable[TaskDataset] = ()) -> None:
        self._datasets: dict[str, TaskDataset] = {}
        self._with_seeds: list[TaskDataset] = []  # asked of every rollout: kept, not searched
        for ds in datasets:
            self.register(ds)

    def register(self, dataset: TaskDataset) -> TaskDataset:
        if dataset.id in self._datasets:
            raise ValueError(f"dataset {dataset.id!r} is registered twice")
        self._datasets[dataset.id] = dataset
        if dataset.seeds is not None:
            self._with_seeds.append(dataset)
        return dataset

    def get(self, dataset_id: str) -> TaskDataset:
        return self._datasets[dataset_id]

    def __iter__(self):
        return iter(self._datasets.values())

    def __len__(self) -> int:
        return len(self._datasets)

    def describe(self) -> list[dict[str, Any]]:
        return [ds.to_dict() for ds in self]

    def unknown_seed(self, seed: int) -> str | None:
        """Why ``seed`` is in none of the datasets that declare seeds (None: it is, or no
        dataset declares them)."""
        declared = self._with_seeds
        if not declared or any(seed in ds.seeds for ds in declared):  # type: ignore[operator]
            return None
        return f"seed {seed} is in none of this app's datasets (" + "; ".join(
            f"{ds.id}: {_seed_text(ds.seeds)}" for ds in declared) + ")"


def _seed_text(seeds: Sequence[int]) -> str:
    if isinstance(seeds, range) and seeds.step == 1 and len(seeds):
        return f"seeds {seeds.start}-{seeds.stop - 1}"
    return f"{len(seeds)} seeds"


@dataclass(frozen=True)
class RubricBundle:
    """The outcome and event rubrics a task app is judged by."""

    outcome: RubricSection | None = None
    events: RubricSection | None = None

    def to_info(self) -> RubricInfo:
        return RubricInfo(outcome=self.outcome, events=self.events)


@dataclass(frozen=True)
class ProxyConfig:
    """Vendor proxies: `/proxy/v1/chat/completions` (OpenAI) and `/proxy/groq/...` (Groq).

    The vendor keys are read from the server's environment (`OPENAI_API_KEY`, `GROQ_API_KEY`)
    at request time and never returned to clients.
    """

    enable_openai: bool = False
    enable_groq: bool = False
    openai_base_url: str = "https://api.openai.com/v1"
    groq_base_url: str = "https://api.groq.com/openai/v1"
    timeout_s: float = 120.0


@dataclass
class RolloutContext:
    """What a rollout executor gets beside its request."""

    request: RolloutRequest
    config: TaskAppConfig
    tracer: SessionTracer
    http: OutboundClient  # an httpx.AsyncClient (see `_outbound`)
    app_state: dict[str, Any]
    sandboxes: list[Sandbox] = field(default_factory=list, repr=False)

    @property
    def run_id(self) -> str:
        return self.request.run_id

    async def sandbox(self, **settings: Any) -> Sandbox:
        """A sandbox for this rollout's code: the app's ``sandbox=`` settings (the defaults
        of `SandboxSettings` without them) with ``settings`` changed. Its commands are
        events of the current timestep; it ends with the rollout (returned, failed or
        cancelled), so the rollout need not end it."""
        from synth_deploy.sandbox import SandboxSettings, open_sandbox

        chosen = self.config.sandbox or SandboxSettings()
        if settings:
            chosen = chosen.updated(**settings)
        box = await open_sandbox(chosen, app=self.config.app_id, rollout=self.run_id,
                                 tracer=self.tracer)
        self.sandboxes.append(box)
        return box

    async def close(self) -> None:
        """End what the rollout holds (its sandboxes): called by the server as it ends."""
        if self.sandboxes:
            from synth_deploy.sandbox import close_sandboxes

            await close_sandboxes(self.sandboxes)


RolloutExecutor = Callable[
    [RolloutRequest, RolloutContext],
    "RolloutResponse | Mapping[str, Any] | Awaitable[RolloutResponse | Mapping[str, Any]]",
]
Hook = Callable[[dict[str, Any]], "None | Awaitable[None]"]


@dataclass
class TaskAppConfig:
    """Everything a task app declares; `create_app(config)` turns it into a server.

    ``provide_task_instances(seeds)`` maps dataset seeds to `TaskInfo` (difficulty, tags...);
    ``rollout(request, ctx)`` runs one episode and may be sync or async. Either may raise
    `BadRequest` to refuse a request the client got wrong (answered 4xx, not 500).

    ``max_seeds_per_request`` bounds `/task_info?seed=...` (422 beyond it);
    ``allow_link_local``: let ``ctx.http`` and the policy call reach link-local addresses
    (169.254.0.0/16, fe80::/10, fd00:ec2::254), where cloud metadata services answer; off by
    default, because a key holder chooses the policy URL.
    ``environment``: the app's `@task_app.environment`; ``session_idle_seconds``: the lease of
    an environment session on OpenEnv's wire (closed after that long unused).
    ``sandbox``: the settings of the sandboxes its rollouts ask for (`ctx.sandbox()`); an
    app that declares them has its leftovers swept as it starts and its sandboxes ended as
    it stops (`synth_deploy.sandbox`).
    ``capture_tokens``: `call_policy` asks for token ids and log-probabilities unless the
    rollout's ``policy.config.capture_tokens`` says otherwise (see `_token_capture`).
    ``identity``: which code this is (`AppIdentity`), set where the app's file is loaded;
    ``code_files``: what it hashes beside the app's Python files. ``scorer``: how an
    episode is scored again from its stored trace (`@task_app.scorer`, see `scoring`).
    """

    app_id: str
    name: str
    description: str
    base_task_info: TaskInfo
    provide_task_instances: Callable[[Sequence[int]], Iterable[TaskInfo]]
    rollout: RolloutExecutor
    describe_taskset: Callable[[], Mapping[str, Any]] | None = None
    dataset_registry: TaskDatasetRegistry = field(default_factory=TaskDatasetRegistry)
    rubrics: RubricBundle = field(default_factory=RubricBundle)
    proxy: ProxyConfig | None = None
    routers: Sequence[Any] = ()
    startup_hooks: Sequence[Hook] = ()
    shutdown_hooks: Sequence[Hook] = ()
    app_state: dict[str, Any] = field(default_factory=dict)
    version: str = "0.1.0"
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_rollout_seconds: float = DEFAULT_MAX_ROLLOUT_SECONDS
    max_seeds_per_request: int = DEFAULT_MAX_SEEDS_PER_REQUEST
    allow_link_local: bool = False
    environment: EnvironmentSpec | None = None  # served on OpenEnv's wire when declared
    session_idle_seconds: float = DEFAULT_SESSION_IDLE_SECONDS
    capture_tokens: bool = False
    code_files: Sequence[str] = ()  # hashed into the app's identity beside its code
    identity: AppIdentity = field(default_factory=AppIdentity)  # version, code digest
    scorer: Scorer | None = None  # an episode scored from its trace (`traces rescore`)
    sandbox: SandboxSettings | None = None  # what `ctx.sandbox()` makes (see its docstring)

    def __post_init__(self) -> None:
        if not self.app_id or not self.app_id.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"app_id must be letters, digits, '-' or '_', got {self.app_id!r}")
        if self.identity == AppIdentity():  # no file hashed (yet): the declared version alone
            self.identity = AppIdentity(version=self.version)


__all__ = [
    "ProxyConfig",
    "RolloutContext",
    "RolloutExecutor",
    "RubricBundle",
    "TaskAppConfig",
    "TaskDataset",
    "TaskDatasetRegistry",
]
