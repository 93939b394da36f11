"""Submitting RL and SFT jobs: keys first, preflight, payload, idempotent create, follow.

`train(options, ui)` runs each config in order and stops after the first that fails. Every
step that talks to someone else sits behind `JobClient` (the backend) or the health checker
(the task app); interaction (confirm, progress, streaming) goes through `TrainUI`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from synth_deploy.env import (
    ENVIRONMENT_API_KEY,
    TASK_APP_URL,
    Env,
    is_secret_name,
    load_env,
    mask,
    redact,
)
from synth_deploy.errors import JobError, JobHTTPError, UsageError
from synth_deploy.train._backend import (
    JobClient,
    RetryPolicy,
    backend_url,
    new_idempotency_key,
)
from synth_deploy.train._configs import TrainConfig, load_config
from synth_deploy.train._sft_data import truncated_copy, validate_sft_file
from synth_deploy.train._stream import JobOutcome, StreamHandler, stream_job

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


class PreflightError(JobError):
    """The task app failed the backend's verification or our health check."""

    def __init__(self, message: str, *, hint: str | None = None, exit_code: int = 1,
                 report: Any = None) -> None:
        super().__init__(message, hint=hint)
        self.exit_code = exit_code
        self.report = report


@dataclass
class TrainOptions:
    """What `synth-deploy train` was asked to do (flags, already parsed)."""

    configs: Sequence[Path]
    kind: str = "auto"
    env_files: Sequence[Path] = ()
    task_url: str | None = None
    dataset: Path | None = None
    backend: str | None = None
    model: str | None = None
    allow_experimental: bool | None = None
    idempotency_key: str | None = None
    poll: bool = True
    poll_timeout_s: float = 3600.0
    poll_interval_s: float = 5.0
    examples: int | None = None
    dry_run: bool = False
    request_timeout_s: float = 30.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    upload_timeout_s: float = 600.0
    upload_interval_s: float = 2.0


@dataclass
class TrainUI:
    """The caller's hooks: progress lines, a confirm step, and the stream renderer."""

    info: Callable[[str], None] = lambda _msg: None
    warn: Callable[[str], None] = lambda _msg: None
    confirm: Callable[[PreparedJob], bool] | None = None
    handler: Callable[[str], StreamHandler] | None = None  # job id -> renderer
    show_dry_run: Callable[[dict[str, Any]], None] = lambda _plan: None


@dataclass
class PreparedJob:
    """One job ready to send: the body, where it goes, and the keys it needs."""

    config: TrainConfig
    kind: str
    payload: dict[str, Any]
    backend_url: str
    idempotency_key: str
    synth_api_key: str | None
    env_api_key: str | None
    task_url: str | None = None
    dataset: Path | None = None
    validation: Path | None = None
    examples: int | None = None
    upload_timeout_s: float = 600.0
    upload_interval_s: float = 2.0

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
            if self.examples:
                plan["uploads"][0]["examples"] = self.examples
            plan["create"] = {"method": "POST", "path": "/api/learning/jobs",
                              "headers": headers, "json": body}
            plan["start"] = {"method": "POST", "path": "/api/learning/jobs/{job_id}/start"}
        return plan


@dataclass
class TrainResult:
    """How one config ended: submitted (job id), followed (outcome), or planned (dry run)."""

    config: Path
    kind: str
    job_id: str | None = None
    idempotency_key: str | None = None
    outcome: JobOutcome | None = None
    plan: dict[str, Any] | None = None

    @property
    def exit_code(self) -> int:
        return self.outcome.exit_code if self.outcome is not None else 0

    def to_dict(self) -> dict[str, Any]:
        return {"config": str(self.config), "type": self.kind, "job_id": self.job_id,
                "idempotency_key": self.idempotency_key,
                "outcome": self.outcome.to_dict() if self.outcome else None,
                "exit_code": self.exit_code}


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


def _model_fields(value: str) -> dict[str, str]:
    return {"source": value} if value.startswith(_CHECKPOINT_PREFIXES) else {"base": value}


def prepare(config: TrainConfig, options: TrainOptions, env: Env) -> PreparedJob:
    """Check keys, resolve URLs and paths, and build the body of the job for one config."""
    task_url = None
    if config.kind == "rl":
        task_url = options.task_url or env.get(TASK_APP_URL) or config.task_url
        task_url = task_url.rstrip("/") if task_url else None
    require_keys(env, config.kind, task_url=task_url, dry_run=options.dry_run)
    base = backend_url(options.backend, env.get(SYNTH_BACKEND_URL))
    key = options.idempotency_key or new_idempotency_key()
    common = dict(config=config, kind=config.kind, backend_url=base, idempotency_key=key,
                  synth_api_key=env.get(SYNTH_API_KEY), env_api_key=env.get(ENVIRONMENT_API_KEY))
    if config.kind == "rl":
        return PreparedJob(payload=_rl_payload(config, options, task_url), task_url=task_url,
                           **common)
    dataset = options.dataset.expanduser().resolve() if options.dataset else config.dataset_path
    if dataset is None:
        raise UsageError(f"{config.path}: no training data: set [job].data_path or pass --dataset")
    return PreparedJob(payload=_sft_payload(config, options, dataset), dataset=dataset,
                       validation=config.validation_path, examples=options.examples,
                       upload_timeout_s=options.upload_timeout_s,
                       upload_interval_s=min(options.upload_interval_s,
                                             options.poll_interval_s), **common)


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


def preflight(job: PreparedJob, client: JobClient, ui: TrainUI, *,
              check: Callable[..., Any] | None = None) -> None:
    """Backend verification, then our own health check of the task app; stop on failure."""
    ui.info(f"verifying task app {job.task_url} with the backend")
    reply = client.verify_task_app(job.task_url or "")
    if isinstance(reply, dict) and (reply.get("ok") is False or reply.get("verified") is False
                                    or str(reply.get("status", "")).lower() == "failed"):
        detail = redact(str(reply.get("detail") or reply.get("error") or reply), job.secrets)
        raise PreflightError(f"the backend could not verify the task app at {job.task_url}: "
                             f"{detail}"[:800],
                             hint="the backend calls the app with your organisation's stored "
                                  "ENVIRONMENT_API_KEY: run `synth-deploy setup` to upload the "
                                  "key the app uses")
    if check is None:
        from synth_deploy.health import check
    ui.info(f"checking {job.task_url}: auth, /health, /task_info")
    report = check(job.task_url, job.env_api_key, seeds=(0,), key_source=ENVIRONMENT_API_KEY)
    if not report.healthy:
        failure = report.failure
        what = (f"{failure.name}: expected {failure.expected}, got {failure.actual}"
                if failure is not None else "unhealthy")
        raise PreflightError(f"task app at {job.task_url} failed the health check ({what})",
                             hint=(failure.hint if failure is not None and failure.hint else
                                   f"run `synth-deploy check {job.task_url}` for details"),
                             exit_code=report.exit_code or 1, report=report)


def submit(job: PreparedJob, client: JobClient, ui: TrainUI) -> str:
    """Create (and for SFT upload and start) the job; return its id."""
    if job.kind == "rl":
        reply = client.create_rl_job(job.payload, job.idempotency_key)
        return str(reply["job_id"])
    payload = copy.deepcopy(job.payload)
    temp: Path | None = None
    try:
        upload = job.dataset
        if job.examples:
            temp = upload = truncated_copy(job.dataset, job.examples)
        for field_name, path in (("training_file_id", upload),
                                 ("validation_file_id", job.validation)):
            if path is None:
                continue
            ui.info(f"uploading {path.name}")
            file_id = client.upload_file(path)["id"]
            ui.info(f"waiting for file {file_id} to be ready")
            client.wait_file_ready(file_id, timeout_s=job.upload_timeout_s,
                                   interval_s=job.upload_interval_s)
            payload[field_name] = file_id
    finally:
        if temp is not None:
            temp.unlink(missing_ok=True)
    job.payload = payload
    reply = client.create_sft_job(payload, job.idempotency_key)
    job_id = str(reply["job_id"])
    client.start_sft_job(job_id)
    return job_id


def validate_data(job: PreparedJob) -> None:
    """Every JSONL line checked (errors by line number) before anything is uploaded."""
    for path in (job.dataset, job.validation):
        if path is None:
            continue
        result = validate_sft_file(path)
        result.raise_for_errors()


def run_one(config: TrainConfig, options: TrainOptions, env: Env, ui: TrainUI, *,
            transport: Any = None, check: Callable[..., Any] | None = None) -> TrainResult:
    """Prepare, check, submit and (with ``poll``) follow one config."""
    for message in config.warnings:
        ui.warn(message)
    job = prepare(config, options, env)
    if job.kind == "sft":
        validate_data(job)
    result = TrainResult(config=config.path, kind=job.kind, idempotency_key=job.idempotency_key)
    if options.dry_run:
        result.plan = job.plan()
        ui.show_dry_run(result.plan)
        return result
    if ui.confirm is not None and not ui.confirm(job):
        raise UsageError(f"{config.path.name}: not submitted (declined)",
                         hint="pass --yes to submit without asking")
    with _masked_errors(job), JobClient(
            job.backend_url, job.synth_api_key or "", timeout_s=options.request_timeout_s,
            retry=options.retry, transport=transport,
            on_retry=lambda n, why: ui.warn(f"retrying ({n}) after {why}")) as client:
        if job.kind == "rl":
            preflight(job, client, ui, check=check)
        job_id = submit(job, client, ui)
        result.job_id = job_id
        ui.info(f"created {job.kind} job {job_id} (idempotency key {job.idempotency_key})")
        if options.poll:
            handler = ui.handler(job_id) if ui.handler else _NullHandler()
            path_kind = "rl" if job.kind == "rl" else "learning"
            result.outcome = stream_job(client, path_kind, job_id, handler,
                                        interval_s=options.poll_interval_s,
                                        timeout_s=options.poll_timeout_s)
    return result


@contextmanager
def _masked_errors(job: PreparedJob) -> Iterator[None]:
    """Backends quote requests back: no key leaves in an error's message, body or payload."""
    try:
        yield
    except JobError as exc:
        exc.message = redact(exc.message, job.secrets)
        exc.args = (exc.message,)
        if isinstance(exc, JobHTTPError):
            exc.payload = masked(exc.payload, job.secrets)
            exc.body = redact(exc.body, job.secrets)
        raise


class _NullHandler:
    wants_metrics = False

    def on_event(self, event: dict[str, Any]) -> None: ...
    def on_metrics(self, points: list[dict[str, Any]]) -> None: ...
    def on_status(self, status: str, job: dict[str, Any]) -> None: ...
    def close(self, outcome: JobOutcome | None) -> None: ...


def train(options: TrainOptions, ui: TrainUI | None = None, *, transport: Any = None,
          check: Callable[..., Any] | None = None,
          environ: dict[str, str] | None = None) -> list[TrainResult]:
    """Run every config in order; stop after the first one that fails (raise) or whose job
    did not succeed. ``transport`` and ``check`` are test seams for the backend and health."""
    ui = ui or TrainUI()
    if not options.configs:
        raise UsageError("no config given", hint="pass --config FILE (repeatable)")
    if options.examples is not None and options.examples < 1:
        raise UsageError(f"--examples must be at least 1, got {options.examples}")
    env = load_env(options.env_files, environ=environ)
    results: list[TrainResult] = []
    for i, path in enumerate(options.configs):
        config = load_config(path, options.kind)
        per_config = options
        if options.idempotency_key and len(options.configs) > 1:
            # One key per job: reusing it for the next config would return the first job.
            per_config = replace(options, idempotency_key=f"{options.idempotency_key}-{i + 1}")
        result = run_one(config, per_config, env, ui, transport=transport, check=check)
        results.append(result)
        if result.exit_code != 0:
            break
    return results


__all__ = [
    "PreflightError",
    "PreparedJob",
    "TrainOptions",
    "TrainResult",
    "TrainUI",
    "masked",
    "prepare",
    "require_keys",
    "train",
]
