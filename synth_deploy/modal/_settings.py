"""`ModalSettings`: how a task app runs on Modal, declared next to the app.

    register_task_app(app_id="math", config_factory=build_config,
                      modal=ModalSettings(pip_packages=["numpy"], secret_names=["openai"],
                                          min_containers=1))

Constructing it imports nothing heavy (the registry keeps it on every loaded entry); the
builder turns it into Modal objects only when a deployment needs them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from synth_deploy.env import is_secret_name
from synth_deploy.errors import UsageError
from synth_deploy.modal._trace_volume import DEFAULT_TRACE_COMMIT_S, default_trace_volume

DEFAULT_PYTHON_VERSION = "3.11"
DEFAULT_TIMEOUT_S = 600
DEFAULT_CONCURRENT_INPUTS = 16
DEFAULT_APP_REMOTE_PATH = "/root/task_app"
FUNCTION_NAME = "web"

APP_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PYTHON = re.compile(r"^3\.(9|1[0-9])$")


def _bad(field_name: str, problem: str, hint: str | None = None) -> UsageError:
    return UsageError(f"ModalSettings.{field_name}: {problem}", hint=hint)


def _tuple(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        # A bare string would otherwise be split into characters.
        return (value,)
    if not isinstance(value, Sequence):
        raise UsageError(f"{where}: expected a list of strings, got {type(value).__name__}")
    for item in value:
        if not isinstance(item, str) or not item.strip():
            raise UsageError(f"{where}: every entry must be a non-empty string, got {item!r}")
    return tuple(value)


def _mapping(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise UsageError(f"{where}: expected a mapping, got {type(value).__name__}")
    return {str(k): str(v) for k, v in value.items()}


@dataclass(frozen=True)
class ModalSettings:
    """Deployment settings of one task app (every field optional).

    ``name``: the Modal app name (default ``synth-<app_id>``); ``python_version``;
    ``pip_packages`` / ``apt_packages``: what the app needs beyond the serving set;
    ``local_dirs``: extra local folders ``{local path (relative to the app's folder): remote
    path}``; ``secret_names``: Modal Secrets created in the dashboard (``Secret.from_name``);
    ``env_files``: .env files (relative to the app's folder) whose variables reach the container
    as a Secret; ``forward_env``: variable names whose values are taken from the deployer's
    resolved environment (vendor keys such as ``OPENAI_API_KEY``); ``env``: plain, non-secret
    variables; ``timeout`` (s), ``memory`` (MiB), ``cpu`` (cores), ``min_containers``,
    ``max_containers``, ``concurrent_inputs`` (requests per container), ``max_rollouts``
    (rollouts a container runs at once, beyond: 503 + Retry-After; default: the kit's, well
    above ``concurrent_inputs``), ``head_after_s`` / ``heartbeat_s`` (when a long rollout's
    200 head and then its spaces are sent; default 20 s / 15 s: below a proxy's limit),
    ``volumes`` ``{mount path: volume name}``, ``ignore``: extra patterns kept out of the
    image; ``trace_volume``: the Modal Volume that keeps the traces when no remote libSQL
    store is set (True: ``<name>-traces``, a string: that Volume, False: none, traces die
    with their container); ``trace_commit_s``: how often a container copies its traces to it
    (the most a killed container loses).
    """

    name: str | None = None
    python_version: str = DEFAULT_PYTHON_VERSION
    pip_packages: Sequence[str] = ()
    apt_packages: Sequence[str] = ()
    local_dirs: Mapping[str, str] = field(default_factory=dict, hash=False)
    secret_names: Sequence[str] = ()
    env_files: Sequence[str] = ()
    forward_env: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict, hash=False)
    timeout: int = DEFAULT_TIMEOUT_S
    memory: int | None = None
    cpu: float | None = None
    min_containers: int = 0
    max_containers: int | None = None
    concurrent_inputs: int = DEFAULT_CONCURRENT_INPUTS
    max_rollouts: int | None = None
    head_after_s: float | None = None
    heartbeat_s: float | None = None
    volumes: Mapping[str, str] = field(default_factory=dict, hash=False)
    ignore: Sequence[str] = ()
    trace_volume: str | bool = True
    trace_commit_s: float = DEFAULT_TRACE_COMMIT_S

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        for name in ("pip_packages", "apt_packages", "secret_names", "env_files",
                     "forward_env", "ignore"):
            set_(self, name, _tuple(getattr(self, name), f"ModalSettings.{name}"))
        for name in ("local_dirs", "env", "volumes"):
            set_(self, name, _mapping(getattr(self, name), f"ModalSettings.{name}"))
        self._validate()

    def _validate(self) -> None:
        if self.name is not None and not APP_NAME_PATTERN.match(self.name):
            raise _bad("name", f"{self.name!r} is not a valid Modal app name",
                       "use letters, digits, '-', '_' or '.', at most 64 characters")
        if not _PYTHON.match(self.python_version):
            raise _bad("python_version", f"{self.python_version!r} is not a Python version",
                       'write it as "3.11"')
        self._validate_env()
        self._validate_paths()
        if not isinstance(self.trace_volume, bool) and not (
                isinstance(self.trace_volume, str) and APP_NAME_PATTERN.match(self.trace_volume)):
            raise _bad("trace_volume", f"{self.trace_volume!r} is not a Volume name",
                       "give True (a Volume named after the app), a name, or False (none)")
        self._validate_sizes()

    def _validate_env(self) -> None:
        """Variable names only, and no secret in clear."""
        for key in self.env:
            if not _ENV_NAME.match(key):
                raise _bad(f"env.{key}", "is not a valid variable name")
            if is_secret_name(key):
                raise _bad(f"env.{key}", "looks like a secret; plain env vars are baked into "
                           "the deployment in clear", "list it in forward_env or a secret instead")
        for key in self.forward_env:
            if not _ENV_NAME.match(key):
                raise _bad("forward_env", f"{key!r} is not a valid variable name")

    def _validate_paths(self) -> None:
        """Mounts and copies go to absolute paths in the container."""
        for mount, volume in self.volumes.items():
            if not mount.startswith("/"):
                raise _bad(f"volumes.{mount}", "mount paths must be absolute (e.g. /data)")
            if not volume:
                raise _bad(f"volumes.{mount}", "needs a volume name")
        for local, remote in self.local_dirs.items():
            if not remote.startswith("/"):
                raise _bad(f"local_dirs.{local}", f"remote path {remote!r} must be absolute")

    def _validate_sizes(self) -> None:
        """Every size and time is positive; the container bounds are in order."""
        positive = {"timeout": self.timeout, "trace_commit_s": self.trace_commit_s,
                    "concurrent_inputs": self.concurrent_inputs,
                    "memory": self.memory, "cpu": self.cpu, "max_containers": self.max_containers,
                    "max_rollouts": self.max_rollouts, "head_after_s": self.head_after_s,
                    "heartbeat_s": self.heartbeat_s}
        for key, value in positive.items():
            if value is not None and (not isinstance(value, int | float) or value <= 0):
                raise _bad(key, f"must be a positive number, got {value!r}")
        if not isinstance(self.min_containers, int) or self.min_containers < 0:
            raise _bad("min_containers", f"must be 0 or more, got {self.min_containers!r}")
        if self.max_containers is not None and self.min_containers > self.max_containers:
            raise _bad("min_containers", f"{self.min_containers} is more than max_containers "
                       f"({self.max_containers})")

    def app_name(self, app_id: str) -> str:
        """The Modal app name: ``name`` or ``synth-<app_id>``."""
        return self.name or f"synth-{app_id}"

    def resources(self) -> dict[str, Any]:
        """The per-function resources, as the plan shows them."""
        return {"timeout_s": self.timeout, "memory_mib": self.memory, "cpu": self.cpu,
                "min_containers": self.min_containers, "max_containers": self.max_containers,
                "concurrent_inputs": self.concurrent_inputs, "max_rollouts": self.max_rollouts,
                "head_after_s": self.head_after_s, "heartbeat_s": self.heartbeat_s,
                "volumes": dict(self.volumes)}

    def trace_volume_name(self, app_name: str) -> str | None:
        """The Volume that keeps the traces of the Modal app ``app_name`` (None: off)."""
        if self.trace_volume is False:
            return None
        if isinstance(self.trace_volume, str):
            return self.trace_volume
        return default_trace_volume(app_name)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else (
                dict(value) if isinstance(value, Mapping) else value)
        return out


__all__ = ["DEFAULT_APP_REMOTE_PATH", "DEFAULT_PYTHON_VERSION", "FUNCTION_NAME",
           "ModalSettings"]
