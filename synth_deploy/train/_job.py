"""`PreparedJob`: one config turned into the request that creates its job, nothing sent yet.

`prepare_job` checks the keys first (saying how to set each missing one), resolves the task
URL, the backend URL and the data paths, and builds the body the backend expects for an RL or
an SFT job. `PreparedJob.plan()` is what `--dry-run` prints: every secret masked.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from synth_deploy.env import (
    ENVIRONMENT_API_KEY,
    TASK_APP_URL,
    Env,
    mask,
    mask_secrets,
    missing_key_hint,
    redact,
)
from synth_deploy.errors import UsageError
from synth_deploy.train._backend import backend_url, new_idempotency_key
from synth_deploy.train._configs import TrainConfig
from synth_deploy.train._options import TrainOptions
from synth_deploy.train._payloads import rl_payload, sft_payload
from synth_deploy.urls import http_url

SYNTH_API_KEY = "SYNTH_API_KEY"
SYNTH_BACKEND_URL = "SYNTH_BACKEND_URL"
_HOW_TO_SET = {
    SYNTH_API_KEY: "copy an API key from the Synth dashboard into .env as SYNTH_API_KEY=… "
                   "(or export it, or pass --env-file FILE)",
    ENVIRONMENT_API_KEY: missing_key_hint(),
    TASK_APP_URL: "pass --task-url URL, set TASK_APP_URL (printed by `synth-deploy tunnel` or "
                  "`synth-deploy deploy`), or set [services].task_url in the config",
}


@dataclass
class PreparedJob:
    """One job ready to send: the body, where it goes, and the keys it needs.

    ``task_url`` is set for RL jobs, ``dataset`` (the file to upload) for SFT jobs; ``payload``
    gains the uploaded file ids once they are known.
    """

    config: TrainConfig
    options: TrainOptions
    payload: dict[str, Any]
    backend_url: str
    idempotency_key: str
    synth_api_key: str | None
    env_api_key: str | None
    task_url: str | None = None
    dataset: Path | None = None

    @property
    def kind(self) -> str:
        return self.config.kind

    @property
    def validation(self) -> Path | None:
        return self.config.validation_path

    @property
    def secrets(self) -> list[str]:
        return [s for s in (self.synth_api_key, self.env_api_key) if s]

    def plan(self) -> dict[str, Any]:
        """What would be sent, secrets masked (the `--dry-run` output): keys, and the
        password of every URL in it (the backend's, the task app's, in the payload too)."""
        plan: dict[str, Any] = {"config": str(self.config.path), "type": self.kind,
                                "backend": self.backend_url}
        create: dict[str, Any] = {"method": "POST", "json": self.payload}
        if self.kind == "rl":
            plan["preflight"] = [{"method": "POST", "path": "/api/rl/verify_task_app",
                                  "json": {"endpoint_base_url": self.task_url}},
                                 {"health_check": self.task_url}]
            plan["create"] = {**create, "path": "/api/rl/jobs"}
        else:
            plan["uploads"] = [{"method": "POST", "path": "/api/files", "file": str(p),
                                "purpose": "fine-tune", "field": name}
                               for name, p in (("training_file_id", self.dataset),
                                               ("validation_file_id", self.validation)) if p]
            if self.options.examples:
                plan["uploads"][0]["examples"] = self.options.examples
            plan["create"] = {**create, "path": "/api/learning/jobs"}
            plan["start"] = {"method": "POST", "path": "/api/learning/jobs/{job_id}/start"}
        plan = masked(plan, self.secrets)
        # Headers go in masked already: the key is not a secret, the bearer token is.
        plan["create"]["headers"] = {"Authorization": f"Bearer {mask(self.synth_api_key)}",
                                     "Idempotency-Key": self.idempotency_key}
        return plan


def masked(value: Any, secrets: Sequence[str] = ()) -> Any:
    """A copy with every secret masked (`mask_secrets`: secret-named keys, URL passwords) and
    the known ``secrets`` redacted wherever they appear."""
    return _redacted(mask_secrets(copy.deepcopy(value)), secrets)


def _redacted(value: Any, secrets: Sequence[str]) -> Any:
    if isinstance(value, dict):
        return {k: _redacted(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_redacted(v, secrets) for v in value]
    return redact(value, secrets) if isinstance(value, str) and secrets else value


def missing_keys(env: Env, kind: str) -> list[str]:
    """The keys a real submission of a ``kind`` job needs that ``env`` does not hold."""
    needed = [SYNTH_API_KEY] + ([ENVIRONMENT_API_KEY] if kind == "rl" else [])
    return [name for name in needed if not env.get(name)]


def how_to_set(name: str) -> str:
    """How to supply the key or URL called ``name``."""
    return _HOW_TO_SET[name]


def require_keys(env: Env, kind: str, *, task_url: str | None, dry_run: bool = False) -> None:
    """Say exactly which keys are missing and how to supply each, before anything else."""
    missing = [] if dry_run else missing_keys(env, kind)
    if kind == "rl" and not task_url:
        missing.append(TASK_APP_URL)
    if missing:
        lines = "\n".join(f"  {name}: {_HOW_TO_SET[name]}" for name in missing)
        raise UsageError(f"missing {', '.join(missing)} for an {kind.upper()} job:\n{lines}",
                         hint="set the value(s) above, then run the same command again")


def prepare_job(config: TrainConfig, options: TrainOptions, env: Env) -> PreparedJob:
    """Check keys, resolve URLs and paths, and build the body of the job for one config."""
    task_url = _task_url(config, options, env) if config.kind == "rl" else None
    require_keys(env, config.kind, task_url=task_url, dry_run=options.dry_run)
    common = dict(config=config, options=options,
                  backend_url=backend_url(options.backend, env.get(SYNTH_BACKEND_URL)),
                  idempotency_key=options.idempotency_key or new_idempotency_key(),
                  synth_api_key=env.get(SYNTH_API_KEY), env_api_key=env.get(ENVIRONMENT_API_KEY))
    if config.kind == "rl":
        payload = rl_payload(config, task_url or "", model=options.model,
                             backend=common["backend_url"] if options.backend else None)
        return PreparedJob(payload=_with_flags(payload, options), task_url=task_url, **common)
    dataset = options.dataset.expanduser().resolve() if options.dataset else config.dataset_path
    if dataset is None:
        raise UsageError(f"{config.path}: no training data: set [job].data_path or pass --dataset")
    payload = _with_flags(sft_payload(config, model=options.model), options)
    return PreparedJob(payload=payload, dataset=dataset, **common)


def _task_url(config: TrainConfig, options: TrainOptions, env: Env) -> str | None:
    """The RL task app's URL: the first one given wins, and is read by the kit's one URL
    rule, named by its source."""
    given = [(options.task_url, "--task-url"), (env.get(TASK_APP_URL), TASK_APP_URL),
             (config.task_url, f"{config.path}: [services].task_url")]
    url, source = next(((u, s) for u, s in given if u), (None, ""))
    return http_url(url, what=source) if url else None


def _with_flags(payload: dict[str, Any], options: TrainOptions) -> dict[str, Any]:
    if options.allow_experimental is not None:  # ours: synth-ai checks models client-side
        payload["allow_experimental"] = options.allow_experimental
    return payload


__all__ = [
    "SYNTH_API_KEY",
    "SYNTH_BACKEND_URL",
    "PreparedJob",
    "how_to_set",
    "masked",
    "missing_keys",
    "prepare_job",
    "require_keys",
]
