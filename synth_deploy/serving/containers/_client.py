"""The client's side of durable rollouts, shared by the kit's runners (smoke, eval,
rehearse) and `check`: does the app advertise them, how a synth-ai rollout body is
submitted, how long to wait between polls, and what a finished rollout's document answers in
``/rollout``'s terms. Pure functions: each caller keeps its own HTTP client and loop.

    if advertises_async(metadata):                    # GET {PREFIX}/metadata
        submit(POST {PREFIX}/rollouts, json=async_submission(body))
        while document["status"] == "running":        # GET poll_path(id): a long poll
            document = poll(...)                      # (after a failure: sleep, back off)
        status, answer = rollout_answer(document)     # as POST /rollout would have

A full app (``503`` with ``Retry-After``: every slot taken) is asked again, not failed, by
every client (`AdmissionWaits`, sync and async alike):

    waits = AdmissionWaits()
    while (pause := waits.after(resp.status_code, resp.headers)) is not None:
        sleep(pause); resp = send()                   # waits.waited_s: said in reports
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

PREFIX = "/containers"
METADATA_PATH = PREFIX + "/metadata"
SUBMIT_PATH = PREFIX + "/rollouts"
FIRST_POLL_S = 0.25
MAX_POLL_S = 2.0
# How long a poll waits at the app for its rollout to finish: a result is seen as it comes,
# and a request is never silent for long (the stand-ins' scaled proxy limits included).
POLL_WAIT_MS = 1000
# Polls that may fail in a row (a proxy's 5xx, a dropped connection) before the client gives
# up: the rollout runs on regardless, and its result waits for the next ask.
POLL_FAILURES_ALLOWED = 5
_RETRYABLE = (429, 502, 503, 504, 520, 522, 524)
# A request refused for a slot is sent again after its Retry-After, growing by half each
# time to at most ADMISSION_MAX_DELAY_S, until it waited ADMISSION_PATIENCE_S in all.
ADMISSION_MAX_DELAY_S = 10.0
ADMISSION_PATIENCE_S = 600.0


class AdmissionWaits:
    """How one request waits for a slot on a full app: ``after(status, headers)`` is the
    pause before sending it again (a 503 with ``Retry-After``), or None (answered, or
    patience spent: the refusal is its answer). ``waited_s`` and ``refusals`` say how long
    and how often it waited."""

    __slots__ = ("waited_s", "refusals")

    def __init__(self) -> None:
        self.waited_s = 0.0
        self.refusals = 0

    def after(self, status: int, headers: Mapping[str, str]) -> float | None:
        asked = _seconds(headers.get("retry-after")) if status == 503 else None
        if asked is None:
            return None
        pause = min(ADMISSION_MAX_DELAY_S, max(asked, 0.05) * 1.5 ** min(self.refusals, 8))
        pause *= random.uniform(0.8, 1.2)  # a crowd refused at once does not return at once
        if self.waited_s + pause > ADMISSION_PATIENCE_S:
            return None
        self.refusals += 1
        self.waited_s += pause
        return pause


def _seconds(value: str | None) -> float | None:
    """Retry-After as seconds (an HTTP date is taken as 1 s: the kit's server sends
    seconds)."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return 1.0


def advertises_async(metadata: Any) -> bool:
    """True when ``metadata`` (the body of GET `METADATA_PATH`) offers async rollouts."""
    capabilities = metadata.get("capabilities") if isinstance(metadata, dict) else None
    modes = capabilities.get("rollout_modes") if isinstance(capabilities, dict) else None
    return isinstance(modes, list) and "async" in modes


def async_submission(body: dict[str, Any]) -> dict[str, Any]:
    """A synth-ai rollout body (``run_id``, ``env``, ``policy``, ...) as an async submission
    of the same rollout: the app's rollout receives the same request."""
    env = body.get("env") or {}
    policy = body.get("policy") or {}
    config = dict(policy.get("config") or {})
    return {"rollout_id": body["run_id"], "submission_mode": "async", "seed": env.get("seed"),
            "env": {"config": env.get("config") or {}, "env_name": env.get("env_name")},
            "policy": {"model": config.get("model"), "config": config},
            "mode": body.get("mode", "rl"), "record": body.get("record") or {},
            "safety": body.get("safety") or {}}


def document_path(rollout_id: str) -> str:
    return f"{SUBMIT_PATH}/{rollout_id}"


def poll_path(rollout_id: str) -> str:
    """Where a client polls ``rollout_id``: its document, answered once it is done or
    after `POLL_WAIT_MS`."""
    return f"{document_path(rollout_id)}?wait_ms={POLL_WAIT_MS}"


def next_poll_delay(delay: float) -> float:
    """The wait before asking again after a failed poll: growing by half, to at most
    `MAX_POLL_S`."""
    return min(MAX_POLL_S, delay * 1.5)


def retryable(status: int) -> bool:
    """A poll answered ``status`` is asked again (a proxy's or a busy server's answer)."""
    return status in _RETRYABLE


def rollout_answer(document: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """A finished rollout's document as ``/rollout`` would have answered it: (200, the
    synth-ai RolloutResponse, its trace put back from the document's), else (its status,
    the kit's error body)."""
    response = document.get("response")
    if document.get("status") == "completed" and isinstance(response, dict):
        if response.get("trace") is None and document.get("trace"):
            response = {**response, "trace": document["trace"]}
        return 200, response
    error = dict(document.get("error") or {})
    status = error.get("status") if isinstance(error.get("status"), int) else 500
    code = error.get("code") or f"rollout_{document.get('status', 'failed')}"
    message = error.get("message") or document.get("status_detail") or \
        f"the rollout ended {document.get('status')}"
    return status, {"detail": {"error": {**error, "code": code, "message": message}}}


__all__ = ["ADMISSION_MAX_DELAY_S", "ADMISSION_PATIENCE_S", "AdmissionWaits", "FIRST_POLL_S",
           "MAX_POLL_S", "METADATA_PATH", "POLL_FAILURES_ALLOWED",
           "POLL_WAIT_MS", "PREFIX", "SUBMIT_PATH", "advertises_async", "async_submission",
           "document_path", "next_poll_delay", "poll_path", "retryable", "rollout_answer"]
