"""Rollouts for the tests that serve a task app: request bodies, a client that sends many at
once, and a served app in a process of its own."""

from __future__ import annotations

import asyncio

import httpx

# A served math app in its own process: python -c SERVER_SCRIPT TRACE_DB API_KEY PORT
SERVER_SCRIPT = """
import sys
from synth_deploy.env import Env
from synth_deploy.serving import LocalRunner, ServeSettings, ServerKeys
from synth_deploy.tracing import parse_trace_db
LocalRunner(ServeSettings(app="math", env=Env(), keys=ServerKeys((sys.argv[2],), "argv"),
                          traces=parse_trace_db(sys.argv[1]), port=int(sys.argv[3]),
                          log_level="warning")).serve_forever()
"""


def rollout_body(run_id: str, seed: int, inference_url: str) -> dict:
    return {"run_id": run_id, "env": {"seed": seed},
            "policy": {"config": {"model": "mock-model", "inference_url": inference_url}},
            "mode": "eval"}


async def fire(url: str, key: str, bodies: list[dict], *, concurrency: int = 32
               ) -> list[tuple[str, int | None]]:
    """POST every body to /rollout; (run_id, status or None when the server went away)."""
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(20.0)) as client:
        async def one(body):
            async with limit:
                try:
                    resp = await client.post(url + "/rollout", json=body,
                                             headers={"X-API-Key": key})
                    return body["run_id"], resp.status_code
                except httpx.HTTPError:
                    return body["run_id"], None
        return await asyncio.gather(*(one(b) for b in bodies))
