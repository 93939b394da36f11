"""`PreparedJob`: one config turned into the request that creates its job, nothing sent yet.

`prepare_job` checks the keys first (saying how to set each missing one), resolves the task
URL, the backend URL and the data paths, and builds the body the backend expects for an RL or
an SFT job. `PreparedJob.plan()` is what `--dry-run` prints: every secret masked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from synth_deploy.env import (
    ENVIRONMENT_API_KEY,
    TASK_APP_URL,
    Env,
    is_secret_name,
    mask,
    redact,
)
from synth_deploy.errors import UsageError
from synth_deploy.train._backend import backend_url, new_idempotency_key
from synth_deploy.train._configs import TrainConfig
from synth_deploy.train._options import TrainOptions

SYNTH_API_KEY = "SYNTH_API_KEY"
SYNTH_BACKEND_URL = "SYNTH_BACKEND_URL"
_CHECKPOINT_PREFIXES = ("ft:", "rl:", "sft:", "peft:")
_HOW_TO_SET = {
    SYNTH_API_KEY: "copy an API key from the Synth dashboard into .env as SYNTH_API_KEY=… "
                   "(or export it, or pass --env-file FILE)",
    ENVIRONMENT_API_KEY: "run `synth-deploy setup` to mint ENVIRONMENT_API_KEY into .env "
                         "(or pass --env-file FILE that sets it)",
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
        """What would be sent, secrets masked (the `--dry-run` output)."""
        plan: dict[str, Any] = {"config": str(self.config.path), "type": self.kind,
                                "backend": self.backend_url}
        body = masked(self.payload, self.secrets)
        # Headers are built already masked: the key is not a secret, the bearer token is.
        headers = {"Authorization": f"Bearer {mask(self.synth_api_key)}",
                   "Idempotency-Key": self.idempotency_key}
        if self.kind == "rl":
            plan["preflight"] = [{"method": "POST", "path": "/api/rl/verify_task_app",
                                  "json": {"endpoint_base_url": self.task_url}},
                                 {"health_check": self.task_url}]
            plan["create"] = {"method": "POST", "path": "/api/rl/jobs", "headers": headers,
                              "json": body}
        else:
            plan["uploads"] = [{"method": "POST", "path": "/api/files", "file": str(p),
                                "purpose": "fine-tune", "field": name}
                               for name, p in (("training_file_id", self.dataset),
                                               ("validation_file_id", self.validation)) if p]
            if self.options.examples:
                plan["uploads"][0]["examples"] = self.options.examples
            plan["create"] = {"method": "POST", "path": "/api/learning/jobs",
                              "headers": headers, "json": body}
            plan["start"] = {"method": "POST", "path": "/api/learning/jobs/{job_id}/start"}
        return plan


def masked(value: Any, secrets: Sequence[str] = ()) -> Any:
    """A copy with every secret-named key masked and known secret values redacted."""
    if isinstance(value, dict):
        return {k: (mask(str(v)) if is_secret_name(str(k)) and isinstance(v, str) and v
                    else masked(v, secrets)) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v, secrets) for v in value]
    if isinstance(value, str):
        return redact(value, secrets)
    return value


def require_keys(env: Env, kind: str, *, task_url: str | None, dry_run: bool = False) -> None:
    """Say exactly which keys are missing and how to supply each, before anything else."""
    needed = [] if dry_run else [SYNTH_API_KEY] + ([ENVIRONMENT_API_KEY] if kind == "rl" else [])
    missing = [name for name in needed if not env.get(name)]
    if kind == "rl" and not task_url:
        missing.append(TASK_APP_URL)
    if missing:
        lines = "\n".join(f"  {name}: {_HOW_TO_SET[name]}" for name in missing)
        raise UsageError(f"missing {', '.join(missing)} for an {kind.upper()} job:\n{lines}",
                         hint="set the value(s) above, then run the same command again")


def prepare_job(config: TrainConfig, options: TrainOptions, env: Env) -> PreparedJob:
    """Check keys, resolve URLs and paths, and build the body of the job for one config."""
    task_url = None
    if config.kind == "rl":
        task_url = options.task_url or env.get(TASK_APP_URL) or config.task_url
        task_url = task_url.rstrip("/") if task_url else None
    require_keys(env, config.kind, task_url=task_url, dry_run=options.dry_run)
    common = dict(config=config, options=options,
                  backend_url=backend_url(options.backend, env.get(SYNTH_BACKEND_URL)),
                  idempotency_key=options.idempotency_key or new_idempotency_key(),
                  synth_api_key=env.get(SYNTH_API_KEY), env_api_key=env.get(ENVIRONMENT_API_KEY))
    if config.kind == "rl":
        return PreparedJob(payload=_rl_payload(config, options, task_url), task_url=task_url,
                           **common)
    dataset = options.dataset.expanduser().resolve() if options.dataset else config.dataset_path
    if dataset is None:
        raise UsageError(f"{config.path}: no training data: set [job].data_path or pass --dataset")
    return PreparedJob(payload=_sft_payload(config, options, dataset), dataset=dataset, **common)


def _model_fields(value: str) -> dict[str, str]:
    return {"source": value} if value.startswith(_CHECKPOINT_PREFIXES) else {"base": value}


def _rl_payload(config: TrainConfig, options: TrainOptions, task_url: str) -> dict[str, Any]:
    cfg = config.backend_dict()
    cfg.setdefault("services", {})["task_url"] = task_url
    section = "policy" if "policy" in cfg else "model"
    if options.model:
        cfg[section] = {**{k: v for k, v in cfg.get(section, {}).items()
                           if k not in ("source", "base")}, **_model_fields(options.model)}
    policy = cfg.get(section, {})
    data: dict[str, Any] = {"endpoint_base_url": task_url, "config": cfg}
    if policy.get("source"):
        data["model"] = policy["source"]
    elif policy.get("base"):
        data["base_model"] = policy["base"]
    payload = {"job_type": "rl", "compute": cfg.get("compute", {}), "data": data,
               "tags": {"source": "synth-deploy"}}
    if options.allow_experimental is not None:
        payload["allow_experimental"] = options.allow_experimental
    return payload


def _sft_payload(config: TrainConfig, options: TrainOptions, dataset: Path) -> dict[str, Any]:
    cfg = config.backend_dict()
    model = options.model or config.model.job.model
    job = cfg.setdefault("job", {})
    job["model"] = model
    job.pop("data", None)
    job["data_path"] = str(dataset)
    if config.validation_path:
        cfg.setdefault("data", {})["validation_path"] = str(config.validation_path)
    hyper = config.model.hyperparameters.model_dump(exclude_none=True)
    training = config.model.training
    if training is not None and training.mode:
        hyper.setdefault("train_kind", training.mode)
    payload: dict[str, Any] = {"model": model, "training_type": "sft_offline",
                               "training_file_id": None, "hyperparameters": hyper,
                               "metadata": {"effective_config": cfg}}
    if options.examples:
        payload["metadata"]["examples_limit"] = options.examples
    if options.allow_experimental is not None:
        payload["allow_experimental"] = options.allow_experimental
    return payload


__all__ = [
    "SYNTH_API_KEY",
    "SYNTH_BACKEND_URL",
    "PreparedJob",
    "masked",
    "prepare_job",
    "require_keys",
]
