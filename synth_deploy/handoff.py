"""Everything that crosses a process boundary through environment variables, in one place.

    variable                 written by                        read by
    SYNTH_DEPLOY_RELOAD      `serve --reload`                  each server process the reloader
                                                               starts (JSON: app, env files,
                                                               key rule, trace database)
    SYNTH_DEPLOY_ENV_FILES   `deploy`, `modal-serve`           the `modal deploy`/`modal serve`
                                                               child, when it imports the app
                                                               file and builds the modal.App
    SYNTH_DEPLOY_TASK_APP    the deploy plan (function env)    the Modal container's entry: the
                                                               app file, relative to /root
    SYNTH_DEPLOY_SANDBOX_APP the deploy plan, for an app that  the Modal container's entry: the
                             declares sandbox=                 Modal app of its sandboxes

No secret value travels here: a child resolves its own `Env` from the same env files (and the
environment it inherits), so keys stay where the user put them. Readers are process entry
points; they pass ``os.environ`` in, and nothing below them reads it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from synth_deploy.errors import SynthDeployError

RELOAD_VAR = "SYNTH_DEPLOY_RELOAD"
ENV_FILES_VAR = "SYNTH_DEPLOY_ENV_FILES"
TASK_APP_VAR = "SYNTH_DEPLOY_TASK_APP"
SANDBOX_APP_VAR = "SYNTH_DEPLOY_SANDBOX_APP"


@dataclass(frozen=True)
class ReloadHandoff:
    """What a reloaded server process needs to rebuild the app `serve --reload` was given."""

    app: str
    env_files: tuple[str, ...] = ()
    key_rule: str = "required"
    trace_db: str | None = None
    trace_source: str = "--trace-db"

    def to_environ(self) -> dict[str, str]:
        return {RELOAD_VAR: json.dumps(asdict(self))}

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> ReloadHandoff:
        raw = environ.get(RELOAD_VAR)
        if not raw:
            raise SynthDeployError(f"{RELOAD_VAR} is not set: this factory is only for the "
                                   "processes that `synth-deploy serve --reload` starts")
        data = json.loads(raw)
        return cls(**{**data, "env_files": tuple(data.get("env_files") or ())})


def env_files_for_child(env_files: Sequence[str | os.PathLike[str]]) -> dict[str, str]:
    """The variable that tells a `modal` child which env files `deploy` resolved."""
    return {ENV_FILES_VAR: os.pathsep.join(str(p) for p in env_files)}


def env_files_from(environ: Mapping[str, str]) -> list[str]:
    """The env files a `modal` child was told about (empty: fall back to ./.env)."""
    return [p for p in (environ.get(ENV_FILES_VAR) or "").split(os.pathsep) if p]


__all__ = [
    "ENV_FILES_VAR",
    "RELOAD_VAR",
    "SANDBOX_APP_VAR",
    "TASK_APP_VAR",
    "ReloadHandoff",
    "env_files_for_child",
    "env_files_from",
]
