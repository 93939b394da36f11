"""Submitting RL and SFT jobs: keys first, preflight, idempotent create, then follow.

`train(options, env, ui)` takes each config in order through the same steps and stops after
the first that fails. Everything it talks to sits behind one seam: the backend behind
`JobClient` (``transport``), the task app behind the health check (``check``); interaction
(progress, confirm, the stream renderer) goes through `TrainUI`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from synth_deploy.env import ENVIRONMENT_API_KEY, Env, redact, redact_userinfo
from synth_deploy.errors import JobError, JobHTTPError, UsageError
from synth_deploy.train._backend import JobClient
from synth_deploy.train._configs import TrainConfig, load_config
from synth_deploy.train._job import PreparedJob, how_to_set, masked, missing_keys, prepare_job
from synth_deploy.train._options import TrainOptions
from synth_deploy.train._payloads import add_validation_file
from synth_deploy.train._sft_data import validate_sft_file
from synth_deploy.train._sft_tools import upload_copy
from synth_deploy.train._stream import JobOutcome, StreamHandler, stream_job
from synth_deploy.urls import is_loopback


class PreflightError(JobError):
    """The task app failed the backend's verification or our health check."""

    def __init__(self, message: str, *, hint: str | None = None, exit_code: int = 1,
                 report: Any = None) -> None:
        super().__init__(message, hint=hint)
        self.exit_code = exit_code
        self.report = report


@dataclass
class TrainUI:
    """The caller's hooks: progress lines, a confirm step, and the stream renderer."""

    info: Callable[[str], None] = lambda _msg: None
    warn: Callable[[str], None] = lambda _msg: None
    confirm: Callable[[PreparedJob], bool] | None = None
    handler: Callable[[str], StreamHandler] | None = None  # job id -> renderer
    show_dry_run: Callable[[dict[str, Any]], None] = lambda _plan: None


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


def train(options: TrainOptions, env: Env, ui: TrainUI | None = None, *,
          transport: Any = None, check: Callable[..., Any] | None = None) -> list[TrainResult]:
    """Run every config in ``options`` in order; stop after the first one that fails (raise)
    or whose job did not succeed.

    ``env`` is resolved by the caller (`synth_deploy.env.load_env`): the keys and URLs not
    set in ``options`` are read from it, never from the process. ``transport`` (an httpx
    transport for the backend) and ``check`` (in place of `synth_deploy.health.check`) are
    the test seams.
    """
    submitter = _Submitter(env, ui or TrainUI(), transport=transport, check=check)
    results: list[TrainResult] = []
    for i, path in enumerate(options.configs):
        config = load_config(path, options.kind)
        per_config = options
        if options.idempotency_key and len(options.configs) > 1:
            # One key per job: reusing it for the next config would return the first job.
            per_config = replace(options, idempotency_key=f"{options.idempotency_key}-{i + 1}")
        result = submitter.run(config, per_config)
        results.append(result)
        if result.exit_code != 0:
            break
    return results


class _Submitter:
    """Takes one config at a time through prepare, check, submit and follow; holds what all
    configs share (the env, the UI, the seams) so that no step re-lists them."""

    def __init__(self, env: Env, ui: TrainUI, *, transport: Any,
                 check: Callable[..., Any] | None) -> None:
        # Lines name the task app and the backend by URL: never with their passwords.
        ui = replace(ui, info=lambda m, say=ui.info: say(redact_userinfo(m)),
                     warn=lambda m, say=ui.warn: say(redact_userinfo(m)))
        self.env, self.ui, self.transport, self.check = env, ui, transport, check

    def run(self, config: TrainConfig, options: TrainOptions) -> TrainResult:
        for message in config.warnings:
            self.ui.warn(message)
        job = prepare_job(config, options, self.env)
        if _unreachable_task_url(job):
            self.ui.warn(f"the task URL {job.task_url} is on this machine: the training backend "
                         f"at {job.backend_url} cannot reach it; run `synth-deploy tunnel APP` "
                         "(or `synth-deploy deploy APP`) and train against the URL it prints")
        if job.kind == "sft":
            _validate_data(job)
        result = TrainResult(config=config.path, kind=job.kind,
                             idempotency_key=job.idempotency_key)
        if options.dry_run:
            for name in missing_keys(self.env, job.kind):
                self.ui.warn(f"{name} is not set: this dry run sends nothing, but submitting "
                             f"the job will need it ({how_to_set(name)})")
            result.plan = job.plan()
            self.ui.show_dry_run(result.plan)
            return result
        if self.ui.confirm is not None and not self.ui.confirm(job):
            raise UsageError(f"{config.path.name}: not submitted (declined)",
                             hint="pass --yes to submit without asking")
        with _masked_errors(job), self._client(job) as client:
            if job.kind == "rl":
                self._preflight(job, client)
            result.job_id = self._submit(job, client)
            self.ui.info(f"created {job.kind} job {result.job_id} "
                         f"(idempotency key {job.idempotency_key})")
            if options.poll:
                result.outcome = self._follow(job, result.job_id, client)
        return result

    def _client(self, job: PreparedJob) -> JobClient:
        return JobClient(job.backend_url, job.synth_api_key or "",
                         timeout_s=job.options.request_timeout_s, retry=job.options.retry,
                         transport=self.transport,
                         on_retry=lambda n, why: self.ui.warn(f"retrying ({n}) after {why}"))

    def _preflight(self, job: PreparedJob, client: JobClient) -> None:
        """Backend verification, then our own health check of the task app."""
        self.ui.info(f"verifying task app {job.task_url} with the backend")
        reply = client.verify_task_app(job.task_url or "")
        if _refused(reply):
            detail = redact(str(reply.get("detail") or reply.get("error") or reply), job.secrets)
            raise PreflightError(f"the backend could not verify the task app at {job.task_url}: "
                                 f"{detail}"[:800],
                                 hint="the backend calls the app with your organisation's "
                                      "stored ENVIRONMENT_API_KEY: run `synth-deploy setup` to "
                                      "upload the key the app uses")
        self._check_health(job)

    def _check_health(self, job: PreparedJob) -> None:
        """`PreflightError` carrying the report when our own check finds the app unhealthy."""
        check = self.check
        if check is None:
            from synth_deploy.health import check
        self.ui.info(f"checking {job.task_url}: auth, /health, /task_info")
        report = check(job.task_url, job.env_api_key, key_source=ENVIRONMENT_API_KEY)
        if report.healthy:
            return
        failure = report.failure
        what = (f"{failure.name}: expected {failure.expected}, got {failure.actual}"
                if failure is not None else "unhealthy")
        raise PreflightError(f"task app at {job.task_url} failed the health check ({what})",
                             hint=(failure.hint if failure is not None and failure.hint else
                                   f"run `synth-deploy check {job.task_url}` for details"),
                             exit_code=report.exit_code or 1, report=report)

    def _submit(self, job: PreparedJob, client: JobClient) -> str:
        """Create (and for SFT upload and start) the job; return its id."""
        if job.kind == "rl":
            with _may_have_created(job):
                return str(client.create_rl_job(job.payload, job.idempotency_key)["job_id"])
        payload = copy.deepcopy(job.payload)
        temps: list[Path] = []
        try:
            for role, path in (("training", job.dataset), ("validation", job.validation)):
                if path is None:
                    continue
                # Tools flattened to the form synth-ai's trainer reads; --examples N cut.
                copy_path = upload_copy(path, examples=job.options.examples
                                        if role == "training" else None)
                if copy_path is not None:
                    temps.append(copy_path)
                self.ui.info(f"uploading {path.name}")
                file_id = client.upload_file(copy_path or path)["id"]
                self.ui.info(f"waiting for file {file_id} to be ready")
                client.wait_file_ready(file_id, timeout_s=job.options.upload_timeout_s,
                                       interval_s=job.options.upload_poll_interval_s)
                if role == "training":
                    payload["training_file_id"] = file_id
                else:
                    add_validation_file(payload, file_id)
        finally:
            for temp in temps:
                temp.unlink(missing_ok=True)
        job.payload = payload
        with _may_have_created(job):
            job_id = str(client.create_sft_job(payload, job.idempotency_key)["job_id"])
            client.start_sft_job(job_id)
        return job_id

    def _follow(self, job: PreparedJob, job_id: str, client: JobClient) -> JobOutcome:
        handler = self.ui.handler(job_id) if self.ui.handler else _NullHandler()
        return stream_job(client, "rl" if job.kind == "rl" else "learning", job_id, handler,
                          interval_s=job.options.poll_interval_s,
                          timeout_s=job.options.poll_timeout_s)


def _unreachable_task_url(job: PreparedJob) -> bool:
    """A task app on this machine, for a backend elsewhere that would have to call it."""
    return bool(job.task_url) and is_loopback(job.task_url) and not is_loopback(job.backend_url)


def _refused(reply: Any) -> bool:
    """The backend's verification said no, in any of the shapes it answers with."""
    return isinstance(reply, dict) and (reply.get("ok") is False or reply.get("verified") is False
                                        or str(reply.get("status", "")).lower() == "failed")


def _validate_data(job: PreparedJob) -> None:
    """Every JSONL line checked (errors by line number) before anything is uploaded."""
    for path in (job.dataset, job.validation):
        if path is not None:
            validate_sft_file(path).raise_for_errors()


@contextmanager
def _may_have_created(job: PreparedJob) -> Iterator[None]:
    """A create that failed without a refusal (no answer, a 5xx, a page that is not JSON)
    may have made the job: the error names the key that finds it again, and how to send it."""
    try:
        yield
    except JobError as exc:
        if isinstance(exc, JobHTTPError) and 400 <= exc.status < 500 \
                and exc.status not in (408, 429):
            raise  # refused: nothing was made
        options = job.options
        if options.idempotency_key:  # given: the same command sends the same key again
            how = "run the same command again"
        else:
            how = f"run it again with --idempotency {job.idempotency_key}"
            if len(options.configs) > 1:
                how += f" --config {job.config.path}"
        reuse = (f"the job may have been created (idempotency key {job.idempotency_key}): "
                 f"{how}, and the backend answers with that job instead of making a second")
        exc.hint = f"{exc.hint}; {reuse}" if exc.hint else reuse
        raise


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


__all__ = [
    "PreflightError",
    "TrainResult",
    "TrainUI",
    "train",
]
