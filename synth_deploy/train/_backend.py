"""The training backend's HTTP API (see shared/spec/backend-api.md), behind one client.

Every call is bounded: each request, answer included, by its timeout as a whole (a backend
dripping bytes cannot hold it), and each answer by a size (`MAX_ANSWER_BYTES`). Connection
errors, timeouts, 5xx, 408 and 429 answers are
retried: after the wait the backend's ``Retry-After`` asks for (capped at
``RetryPolicy.max_retry_after_s``), else with exponential backoff. Job creation sends the same
``Idempotency-Key`` on every attempt, so a create whose answer was lost (502 after the job was
recorded, a stalled reply) yields one job, not two. Any other non-2xx answer raises
JobHTTPError with the status and the body.
"""

from __future__ import annotations

import email.utils
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx

from synth_deploy.env import mask
from synth_deploy.errors import JobError, JobHTTPError
from synth_deploy.tls import client_ssl_context
from synth_deploy.train._bounded import (
    MAX_ANSWER_BYTES,
    AnswerTooLarge,
    bounded_send,
    install_deadlines,
)
from synth_deploy.urls import http_url

DEFAULT_BACKEND_URL = "https://api.usesynth.ai"
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_RETRIES = 4
DEFAULT_BACKOFF_S = 0.5
DEFAULT_MAX_RETRY_AFTER_S = 60.0
# Answers that mean "not now" rather than "no": the same request may succeed later.
_RETRY_LATER = {408: "request timeout", 429: "rate limited"}
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled", "canceled", "completed"})
SUCCESS_STATUSES = frozenset({"succeeded", "completed"})
FILE_READY = frozenset({"ready", "processed", "succeeded", "completed", "uploaded"})
FILE_FAILED = frozenset({"failed", "error", "rejected"})

JobKindPath = Literal["rl", "learning"]


def new_idempotency_key() -> str:
    """A fresh key for one logical job creation (reused on every retry of it)."""
    return f"synth-deploy-{uuid.uuid4()}"


def backend_url(flag: str | None, env_value: str | None) -> str:
    """``--backend`` > ``SYNTH_BACKEND_URL`` > production; a trailing ``/api`` is tolerated."""
    url = http_url(flag or env_value or DEFAULT_BACKEND_URL,
                   what="--backend" if flag else "SYNTH_BACKEND_URL" if env_value else "")
    return url[: -len("/api")] if url.endswith("/api") else url


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a failed request is tried again."""

    retries: int = DEFAULT_RETRIES
    backoff_s: float = DEFAULT_BACKOFF_S
    max_backoff_s: float = 8.0
    max_retry_after_s: float = DEFAULT_MAX_RETRY_AFTER_S

    def delay(self, attempt: int) -> float:
        return min(self.backoff_s * (2 ** attempt), self.max_backoff_s)

    def wait_for(self, attempt: int, resp: httpx.Response | None) -> tuple[float, str]:
        """How long to wait before the next attempt, and why (for the screen)."""
        asked = retry_after_s(resp.headers.get("retry-after")) if resp is not None else None
        if asked is None:
            wait = self.delay(attempt)
            return wait, f"waiting {wait:g}s"
        wait = min(asked, self.max_retry_after_s)
        capped = f", capped from {asked:g}s" if wait < asked else ""
        return wait, f"waiting {wait:g}s as the backend's Retry-After asks{capped}"


def retry_after_s(value: str | None) -> float | None:
    """A ``Retry-After`` header in seconds (delay-seconds or an HTTP date), else None."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - time.time()) if when.tzinfo is not None else None


def _rewind(files: Any) -> None:
    """A retried upload must send the whole file again."""
    if files is not None:
        for _name, (_fname, fh, _ctype) in files.items():
            fh.seek(0)


class JobClient:
    """Synchronous client for the training backend.

    ``transport`` is the test seam (an ``httpx`` transport, e.g. ``httpx.MockTransport``);
    ``on_retry(attempt, reason)`` is told about every retry, before its wait, so a CLI can
    show what failed and how long it waits (``reason``: "HTTP 429 (rate limited); waiting
    2s as the backend's Retry-After asks").
    """

    def __init__(self, base_url: str, api_key: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 retry: RetryPolicy | None = None, transport: httpx.BaseTransport | None = None,
                 on_retry: Callable[[int, str], None] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self.retry = retry or RetryPolicy()
        self.on_retry = on_retry
        self.timeout_s = timeout_s
        self._http = httpx.Client(
            base_url=self.base_url, timeout=httpx.Timeout(timeout_s), transport=transport,
            verify=client_ssl_context(),
            headers={"Authorization": f"Bearer {api_key}", "User-Agent": "synth-deploy"},
        )
        install_deadlines(self._http)

    def __repr__(self) -> str:
        return f"JobClient({self.base_url!r}, api_key={mask(self._api_key)!r})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> JobClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport with retries -------------------------------------------------------------

    def request(self, method: str, path: str, *, json: Any = None,
                params: Mapping[str, Any] | None = None, headers: Mapping[str, str] | None = None,
                files: Any = None, data: Any = None, payload_for_errors: Any = None,
                timeout_s: float | None = None) -> Any:
        """Send one request (retried on connect errors, timeouts, 5xx, 408 and 429); return
        its JSON."""
        url = f"/api{path}"
        extra = {"timeout": timeout_s} if timeout_s is not None else {}
        within_s = timeout_s if timeout_s is not None else self.timeout_s
        last_reason = ""
        for attempt in range(self.retry.retries + 1):
            _rewind(files)
            resp, retryable, last_reason = self._send_once(
                method, url, within_s, json=json, params=params, headers=headers, files=files,
                data=data, **extra)
            if resp is not None and not retryable:
                return self._decode(resp, method, url, payload_for_errors)
            if attempt >= self.retry.retries:
                break
            wait, why = self.retry.wait_for(attempt, resp)
            if self.on_retry is not None:
                self.on_retry(attempt + 1, f"{last_reason}; {why}")
            time.sleep(wait)
        if resp is not None:
            self._decode(resp, method, url, payload_for_errors)  # raises JobHTTPError
        raise JobError(
            f"{method} {self.base_url}{url} failed after {self.retry.retries + 1} attempts "
            f"({last_reason})",
            hint="check --backend / SYNTH_BACKEND_URL and your network, then retry",
        )

    def _send_once(self, method: str, url: str, within_s: float, **kwargs: Any
                   ) -> tuple[httpx.Response | None, bool, str]:
        """One attempt: the answer (None when nothing answered), whether a retry may fix it,
        and what happened, for the retry notice and the final error."""
        try:
            request = self._http.build_request(method, url, **kwargs)
            resp = bounded_send(self._http, request, within_s=within_s)
        except AnswerTooLarge:
            raise JobError(f"{method} {self.base_url}{url} answered more than "
                           f"{MAX_ANSWER_BYTES // 2**20} MiB; the answer was not read",
                           hint="check --backend / SYNTH_BACKEND_URL: is it the training "
                                "backend?") from None
        except (httpx.TimeoutException, httpx.TransportError) as exc:
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return None, True, reason
        later = _RETRY_LATER.get(resp.status_code)
        retryable = resp.status_code >= 500 or later is not None
        return resp, retryable, f"HTTP {resp.status_code}" + (f" ({later})" if later else "")

    def _decode(self, resp: httpx.Response, method: str, url: str, payload: Any) -> Any:
        if resp.status_code >= 400:
            hint = {
                401: "SYNTH_API_KEY was refused: copy a current key from the Synth dashboard",
                403: "this SYNTH_API_KEY may not do this: check the organisation and plan",
                404: "the backend does not know this path or id: check --backend",
                408: "the backend timed out reading the request: check the network, retry",
                422: "the backend rejected the payload: see its response body above",
                429: "the backend is rate limiting this key: wait a minute and try again",
            }.get(resp.status_code)
            raise JobHTTPError(f"{method} {self.base_url}{url} answered HTTP {resp.status_code}",
                               status=resp.status_code, body=resp.text[:4000], payload=payload,
                               hint=hint)
        if not resp.content:
            return {}
        try:
            return resp.json()
        except ValueError:
            raise JobError(f"{method} {self.base_url}{url} answered with non-JSON "
                           f"({resp.text[:200]!r})") from None

    # -- the API ----------------------------------------------------------------------------

    def verify_task_app(self, task_url: str) -> dict[str, Any]:
        """Ask the backend to call the task app with the org's stored environment keys."""
        body = {"endpoint_base_url": task_url}
        return self.request("POST", "/rl/verify_task_app", json=body, payload_for_errors=body)

    def create_rl_job(self, payload: dict[str, Any], idempotency_key: str) -> dict[str, Any]:
        return self._create("/rl/jobs", payload, idempotency_key)

    def create_sft_job(self, payload: dict[str, Any], idempotency_key: str) -> dict[str, Any]:
        return self._create("/learning/jobs", payload, idempotency_key)

    def _create(self, path: str, payload: dict[str, Any], key: str) -> dict[str, Any]:
        reply = self.request("POST", path, json=payload, headers={"Idempotency-Key": key},
                             payload_for_errors=payload)
        job_id = reply.get("job_id") or reply.get("id") if isinstance(reply, dict) else None
        if not job_id:
            raise JobError(f"the backend created a job but returned no id: {reply!r}"[:400])
        return {**reply, "job_id": job_id}

    def start_sft_job(self, job_id: str) -> dict[str, Any]:
        return self.request("POST", f"/learning/jobs/{job_id}/start", json={})

    def upload_file(self, path: Path, purpose: str = "fine-tune") -> dict[str, Any]:
        """Upload a JSONL file; the reply carries its ``id``."""
        with path.open("rb") as fh:
            reply = self.request("POST", "/files",
                                 files={"file": (path.name, fh, "application/jsonl")},
                                 data={"purpose": purpose},
                                 payload_for_errors={"file": str(path), "purpose": purpose})
        if not isinstance(reply, dict) or not reply.get("id"):
            raise JobError(f"the backend accepted {path.name} but returned no file id")
        return reply

    def get_file(self, file_id: str) -> dict[str, Any]:
        return self.request("GET", f"/files/{file_id}")

    def wait_file_ready(self, file_id: str, *, timeout_s: float = 300.0,
                        interval_s: float = 2.0) -> dict[str, Any]:
        """Poll an uploaded file until the backend says it is ready (or failed, or timeout)."""
        deadline = time.monotonic() + timeout_s
        while True:
            info = self.get_file(file_id)
            status = str(info.get("status") or "ready").lower()
            if status in FILE_READY:
                return info
            if status in FILE_FAILED:
                raise JobError(f"the backend rejected uploaded file {file_id}: "
                               f"{info.get('error') or status}",
                               hint="fix the data file and submit again")
            if time.monotonic() + interval_s > deadline:
                raise JobError(f"uploaded file {file_id} was not ready after {timeout_s:g}s "
                               f"(status {status!r})", hint="retry later; the upload is kept")
            time.sleep(interval_s)

    def get_job(self, kind: JobKindPath, job_id: str) -> dict[str, Any]:
        return self.request("GET", f"/{kind}/jobs/{job_id}")

    def get_events(self, kind: JobKindPath, job_id: str, since_seq: int = 0,
                   limit: int = 200) -> list[dict[str, Any]]:
        reply = self.request("GET", f"/{kind}/jobs/{job_id}/events",
                             params={"since_seq": since_seq, "limit": limit})
        events = reply.get("events", []) if isinstance(reply, dict) else reply
        return [e for e in events or [] if isinstance(e, dict)]

    def get_metrics(self, kind: JobKindPath, job_id: str) -> list[dict[str, Any]]:
        reply = self.request("GET", f"/{kind}/jobs/{job_id}/metrics")
        points = reply.get("points", reply.get("metrics", [])) if isinstance(reply, dict) else reply
        return [p for p in points or [] if isinstance(p, dict)]


__all__ = [
    "DEFAULT_BACKEND_URL",
    "FILE_READY",
    "JobClient",
    "RetryPolicy",
    "SUCCESS_STATUSES",
    "TERMINAL_STATUSES",
    "backend_url",
    "new_idempotency_key",
    "retry_after_s",
]
