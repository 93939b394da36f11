"""Which secrets reach the container, and from where.

Secret values travel as Modal Secrets (``Secret.from_dict`` built from values resolved by
``synth_deploy.env``, or ``Secret.from_name`` for secrets kept in Modal): never in the image,
never in the function's plain ``env``, and shown only masked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from synth_deploy.env import (
    ENVIRONMENT_API_KEY,
    ENVIRONMENT_API_KEY_ALIASES,
    Env,
    mask,
    parse_env_file,
)
from synth_deploy.errors import UsageError
from synth_deploy.modal._settings import ModalSettings
from synth_deploy.tracing import TOKEN_VAR, TRACES_DB_VAR, TraceDbSetting


@dataclass(frozen=True)
class SecretSource:
    """One Modal Secret given to the function.

    ``kind`` is "dict" (values resolved here; ``origins`` says where each came from) or "name"
    (a Secret stored in Modal, looked up at deploy time). ``values`` never appear in a repr.
    """

    kind: str
    name: str
    values: Mapping[str, str] = field(default_factory=dict, repr=False, hash=False)
    origins: Mapping[str, str] = field(default_factory=dict, hash=False)

    def describe(self) -> dict[str, Any]:
        """Names and masked values: what the plan may show."""
        if self.kind == "name":
            return {"kind": "name", "name": self.name, "keys": "(stored in Modal)"}
        return {"kind": "dict", "name": self.name,
                "keys": {k: {"value": mask(v), "from": self.origins.get(k, "?")}
                         for k, v in sorted(self.values.items())}}

    def to_modal(self) -> Any:
        import modal

        if self.kind == "name":
            return modal.Secret.from_name(self.name)
        return modal.Secret.from_dict(dict(self.values))


def resolve_secrets(settings: ModalSettings, env: Env, app_dir: Path,
                    traces: TraceDbSetting) -> list[SecretSource]:
    """The secrets a deployment needs, resolved from ``env`` and the settings' env files
    (``traces``: the deployment's trace database; a remote one travels as a secret).

    Raises `UsageError` naming the missing variable and how to set it.
    """
    values: dict[str, str] = {}
    origins: dict[str, str] = {}

    def take(name: str) -> None:
        values[name] = env.get(name) or ""
        origins[name] = env.source(name) or "?"

    if env.get(ENVIRONMENT_API_KEY) is None:
        raise UsageError(
            f"{ENVIRONMENT_API_KEY} is not set: the deployed app would reject every request",
            hint="run `synth-deploy setup`, or put ENVIRONMENT_API_KEY=... in .env "
                 "(or a file passed with --env-file)")
    take(ENVIRONMENT_API_KEY)
    if env.get(ENVIRONMENT_API_KEY_ALIASES):
        take(ENVIRONMENT_API_KEY_ALIASES)
    if traces.is_remote:
        take(TRACES_DB_VAR)
        if env.get(TOKEN_VAR):
            take(TOKEN_VAR)
    for name in settings.forward_env:
        if env.get(name) is None:
            raise UsageError(f"ModalSettings.forward_env: {name} is not set",
                             hint=f"set {name} in the environment or in a file passed with "
                                  "--env-file")
        take(name)
    for relative in settings.env_files:
        path = (app_dir / relative).resolve()
        for name, value in parse_env_file(path).items():
            values[name], origins[name] = value, str(path)

    sources = [SecretSource("dict", "synth-deploy-env", values, origins)]
    sources += [SecretSource("name", name) for name in settings.secret_names]
    return sources


__all__ = ["SecretSource", "resolve_secrets"]
