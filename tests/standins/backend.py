"""A stand-in for the Synth training backend (shared/spec/backend-api.md), with fault knobs.

Served for real with BackgroundServer on 127.0.0.1. It implements the contract the client
uses — bearer auth, /api/rl/verify_task_app (which really calls the task app's /health with
the stored environment keys), RL and SFT job creation honouring Idempotency-Key, file upload
with a "processing" phase, start, status, events?since_seq=&limit= and metrics — and lets a
test inject: 502s on the first creates (after the job is recorded, as a proxy losing the
answer would), creates that stall past the client's timeout, a job that fails, a slow event
stream, an upload that takes a while to become ready, event and error text full of rich
markup, a refusal on any path that echoes the caller's Authorization header back, and rate
limiting: the first N requests matching a pattern answered 429 (or 408) with ``Retry-After``,
before they reach the API (so a throttled create records nothing, as a real limiter's would);
creates answered with an HTML page once the job is recorded; answers that drip a byte at a
time, or never end.
"""

from __future__ import annotations

import asyncio
import email.policy
import itertools
import re
import threading
import time
from dataclasses import dataclass, field
from email.parser import BytesParser
from typing import Any

import httpx
from fastapi import FastAPI, Header, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse


def parse_multipart(content_type: str, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """multipart/form-data -> {field: (filename, bytes)}, with the stdlib's MIME parser
    (python-multipart is not a dependency of the kit)."""
    if not content_type.startswith("multipart/form-data"):
        return {}
    message = BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + body)
    fields = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if name:
            fields[name] = (part.get_filename(), part.get_payload(decode=True) or b"")
    return fields


@dataclass
class Faults:
    """Fault injection knobs; change them on ``backend.faults`` before the test runs."""

    fail_creates: int = 0          # first N creates answer 502 after recording the job
    stall_creates: int = 0         # first N creates sleep ``stall_s`` before answering
    stall_s: float = 1.0
    job_fails: bool = False        # the job ends "failed" instead of "succeeded"
    event_step_s: float = 0.0      # seconds between consecutive events becoming visible
    iterations: int = 3            # progress events (each with a loss metric)
    file_ready_after_s: float = 0.0
    file_fails: bool = False
    reject_payload: bool = False   # creates answer 422 with a detail body
    verify_says_ok: bool = False   # verify_task_app answers ok without calling the app
    step_message: str | None = None  # the text of every progress event, if set
    error_message: str = "trainer crashed: CUDA OOM"  # a failed job's event and error
    refuse_path_suffix: str | None = None  # requests whose path ends so answer refuse_status,
    refuse_status: int = 400                # echoing the Authorization header in the body
    throttle: str | None = None    # regex on "METHOD /path": matching requests are throttled
    throttle_count: int = 0        # how many of them (then they pass)
    throttle_status: int = 429
    retry_after: str | None = "1"  # the Retry-After header of a throttled answer
    html_creates: int = 0          # first N creates answer 200 with an HTML page, after
                                   # recording the job (a proxy's page in place of the answer)
    drip: str | None = None        # regex on "METHOD /path": answered 200, a byte every drip_s
    drip_s: float = 1.0
    huge: str | None = None        # regex on "METHOD /path": answered 200 with huge_bytes
    huge_bytes: int = 0            # of JSON-looking padding, streamed without a length


@dataclass
class Job:
    id: str
    kind: str                      # "rl" | "learning"
    payload: dict[str, Any]
    idempotency_key: str | None
    started_at: float | None = None
    script: list[dict[str, Any]] = field(default_factory=list)


class StandinBackend:
    """State and app. ``requests`` logs (method, path) in arrival order."""

    def __init__(self, api_key: str, *, env_keys: list[str] | None = None) -> None:
        self.api_key = api_key
        self.env_keys = list(env_keys or [])  # the organisation's stored ENVIRONMENT_API_KEYs
        self.faults = Faults()
        self.jobs: dict[str, Job] = {}
        self.by_key: dict[str, str] = {}
        self.create_attempts: dict[str | None, int] = {}
        self.files: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.throttled: list[tuple[str, str, str | None]] = []  # method, path, idempotency key
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.app = self._build()

    # -- helpers --------------------------------------------------------------------------

    def _auth(self, authorization: str | None) -> None:
        if authorization != f"Bearer {self.api_key}":
            raise HTTPException(401, detail="invalid or missing API key")

    def _script(self, prefix: str) -> list[dict[str, Any]]:
        events = [{"type": f"{prefix}.created", "message": "job created"},
                  {"type": f"{prefix}.running", "message": "training started"}]
        step_type = "rl.iteration.complete" if prefix == "rl" else "sft.epoch.complete"
        for i in range(self.faults.iterations):
            loss = round(2.0 / (i + 1), 4)
            events.append({"type": step_type,
                           "message": self.faults.step_message or f"step {i + 1} loss={loss}",
                           "data": {"step": i + 1, "loss": loss}})
        if self.faults.job_fails:
            events.append({"type": f"{prefix}.failed", "message": self.faults.error_message,
                           "data": {"status": "failed"}})
        else:
            events.append({"type": f"{prefix}.succeeded", "message": "done",
                           "data": {"status": "succeeded"}})
        return [{**e, "seq": n, "created_at": None} for n, e in enumerate(events, 1)]

    def _visible(self, job: Job) -> list[dict[str, Any]]:
        if job.started_at is None:
            return job.script[:1]
        if self.faults.event_step_s <= 0:
            return job.script
        shown = 1 + int((time.monotonic() - job.started_at) / self.faults.event_step_s)
        return job.script[:shown]

    def _status(self, job: Job) -> str:
        last = self._visible(job)[-1]["type"]
        if last.endswith(".succeeded"):
            return "succeeded"
        if last.endswith(".failed"):
            return "failed"
        if last.endswith(".created"):
            return "queued" if job.kind == "rl" or job.started_at else "created"
        return "running"

    def jobs_for_key(self, key: str) -> list[Job]:
        return [j for j in self.jobs.values() if j.idempotency_key == key]

    async def _create(self, kind: str, payload: dict[str, Any], key: str | None) -> Any:
        with self._lock:
            attempt = self.create_attempts.get(key, 0) + 1
            self.create_attempts[key] = attempt
            total = sum(self.create_attempts.values())
            if self.faults.reject_payload:
                return JSONResponse({"detail": "hyperparameters.batch_size must be > 0"}, 422)
            if key is not None and key in self.by_key:
                job = self.jobs[self.by_key[key]]
            else:
                job = Job(id=f"job_{next(self._ids):04d}", kind=kind, payload=payload,
                          idempotency_key=key,
                          script=self._script("rl" if kind == "rl" else "sft"))
                if kind == "rl":
                    job.started_at = time.monotonic()
                self.jobs[job.id] = job
                if key is not None:
                    self.by_key[key] = job.id
        if total <= self.faults.html_creates:
            return HTMLResponse("<html><body><h1>502 Bad Gateway</h1>nginx</body></html>")
        if total <= self.faults.stall_creates:
            await asyncio.sleep(self.faults.stall_s)
        if total <= self.faults.stall_creates + self.faults.fail_creates and \
                total > self.faults.stall_creates:
            return JSONResponse({"detail": "bad gateway"}, 502)
        return {"job_id": job.id, "status": self._status(job)}

    def _job(self, kind: str, job_id: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None or job.kind != kind:
            raise HTTPException(404, detail=f"no {kind} job {job_id}")
        return job

    # -- the app --------------------------------------------------------------------------

    def _build(self) -> FastAPI:
        app = FastAPI()

        @app.middleware("http")
        async def log(request: Request, call_next):
            self.requests.append((request.method, request.url.path))
            faults = self.faults
            if faults.throttle and faults.throttle_count > 0 and re.search(
                    faults.throttle, f"{request.method} {request.url.path}"):
                faults.throttle_count -= 1
                self.throttled.append((request.method, request.url.path,
                                       request.headers.get("idempotency-key")))
                headers = {"Retry-After": faults.retry_after} if faults.retry_after else {}
                return JSONResponse({"detail": "slow down"}, faults.throttle_status, headers)
            where = f"{request.method} {request.url.path}"
            if faults.drip and re.search(faults.drip, where):
                async def drip():
                    for byte in b'{"job_id": "job_dripped", "status": "queued"}':
                        yield bytes([byte])
                        await asyncio.sleep(faults.drip_s)
                return StreamingResponse(drip(), media_type="application/json")
            if faults.huge and re.search(faults.huge, where):
                async def huge():
                    sent = 0
                    yield b'{"pad": "'
                    while sent < faults.huge_bytes:
                        yield b"x" * 2**20
                        sent += 2**20
                    yield b'"}'
                return StreamingResponse(huge(), media_type="application/json")
            suffix = self.faults.refuse_path_suffix
            if suffix and request.url.path.endswith(suffix):
                # A careless backend quoting the request back, credentials included.
                return JSONResponse({"detail": "refused request with Authorization "
                                     f"{request.headers.get('authorization')!r}"},
                                    self.faults.refuse_status)
            return await call_next(request)

        @app.post("/api/rl/verify_task_app")
        async def verify(body: dict[str, Any], authorization: str | None = Header(None)):
            self._auth(authorization)
            url = str(body.get("endpoint_base_url") or "").rstrip("/")
            if self.faults.verify_says_ok:
                return {"ok": True, "endpoint_base_url": url, "status": 200}
            attempts = []
            async with httpx.AsyncClient(timeout=5.0) as client:
                for key in self.env_keys:
                    try:
                        r = await client.get(url + "/health", headers={"X-API-Key": key})
                        attempts.append(r.status_code)
                        if r.status_code == 200:
                            return {"ok": True, "endpoint_base_url": url, "status": 200}
                    except httpx.HTTPError as exc:
                        attempts.append(type(exc).__name__)
            return {"ok": False, "endpoint_base_url": url, "attempts": attempts,
                    "detail": "no stored environment key was accepted by the task app"}

        @app.post("/api/rl/jobs")
        async def create_rl(body: dict[str, Any], authorization: str | None = Header(None),
                            idempotency_key: str | None = Header(None)):
            self._auth(authorization)
            if body.get("job_type") != "rl" or "endpoint_base_url" not in body.get("data", {}):
                raise HTTPException(422, detail="job_type 'rl' and data.endpoint_base_url needed")
            return await self._create("rl", body, idempotency_key)

        @app.post("/api/learning/jobs")
        async def create_sft(body: dict[str, Any], authorization: str | None = Header(None),
                             idempotency_key: str | None = Header(None)):
            self._auth(authorization)
            file_id = body.get("training_file_id")
            if body.get("training_type") != "sft_offline" or file_id not in self.files:
                raise HTTPException(422, detail=f"unknown training_file_id {file_id!r}")
            if self.files[file_id]["status"] != "ready":
                raise HTTPException(409, detail=f"file {file_id} is not ready")
            return await self._create("learning", body, idempotency_key)

        @app.post("/api/learning/jobs/{job_id}/start")
        async def start(job_id: str, authorization: str | None = Header(None)):
            self._auth(authorization)
            job = self._job("learning", job_id)
            if job.started_at is None:
                job.started_at = time.monotonic()
            return {"job_id": job.id, "status": self._status(job)}

        @app.post("/api/files")
        async def upload(request: Request, authorization: str | None = Header(None)):
            self._auth(authorization)
            fields = parse_multipart(request.headers.get("content-type", ""),
                                     await request.body())
            if "file" not in fields or fields.get("purpose", (None, b""))[1] != b"fine-tune":
                raise HTTPException(422, detail="multipart field 'file' and purpose=fine-tune")
            filename, content = fields["file"]
            file_id = f"file_{next(self._ids):04d}"
            self.files[file_id] = {"id": file_id, "purpose": "fine-tune", "filename": filename,
                                   "bytes": len(content), "content": content,
                                   "status": "processing", "uploaded_at": time.monotonic()}
            return {"id": file_id, "status": "processing"}

        @app.get("/api/files/{file_id}")
        async def get_file(file_id: str, authorization: str | None = Header(None)):
            self._auth(authorization)
            info = self.files.get(file_id)
            if info is None:
                raise HTTPException(404, detail=f"no file {file_id}")
            if info["status"] == "processing" and \
                    time.monotonic() - info["uploaded_at"] >= self.faults.file_ready_after_s:
                info["status"] = "failed" if self.faults.file_fails else "ready"
            return {k: v for k, v in info.items() if k not in ("content", "uploaded_at")}

        for kind in ("rl", "learning"):
            self._job_routes(app, kind)
        return app

    def _job_routes(self, app: FastAPI, kind: str) -> None:
        @app.get(f"/api/{kind}/jobs/{{job_id}}")
        async def status(job_id: str, authorization: str | None = Header(None)):
            self._auth(authorization)
            job = self._job(kind, job_id)
            out: dict[str, Any] = {"job_id": job.id, "status": self._status(job)}
            if out["status"] == "succeeded":
                out.update(model_id=f"ft:standin:{job.id}", final_reward=0.75,
                           checkpoints=[{"step": self.faults.iterations}])
            elif out["status"] == "failed":
                out["error"] = self.faults.error_message
            return out

        @app.get(f"/api/{kind}/jobs/{{job_id}}/events")
        async def events(job_id: str, since_seq: int = 0, limit: int = 200,
                         authorization: str | None = Header(None)):
            self._auth(authorization)
            job = self._job(kind, job_id)
            new = [e for e in self._visible(job) if e["seq"] > since_seq][:limit]
            return {"events": new}

        @app.get(f"/api/{kind}/jobs/{{job_id}}/metrics")
        async def metrics(job_id: str, authorization: str | None = Header(None)):
            self._auth(authorization)
            job = self._job(kind, job_id)
            points = [{"name": "train.loss", "step": e["data"]["step"],
                       "value": e["data"]["loss"]}
                      for e in self._visible(job) if "loss" in (e.get("data") or {})]
            return {"points": points}


__all__ = ["Faults", "Job", "StandinBackend"]
