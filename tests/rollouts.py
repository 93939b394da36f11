"""Rollouts for the tests that serve a task app: request bodies, a client that sends many at
once, and a served app in a process of its own."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx

MATH_RL = Path(__file__).resolve().parents[1] / "apps" / "math" / "configs" / "rl.toml"

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


def small_rl_config(folder: Path):
    """The math app's rl.toml with a batch of 2 (a group of 2, both at once), loaded."""
    from synth_deploy.train import load_config

    text = MATH_RL.read_text()
    for name, value in {"episodes_per_batch": 2, "group_size": 2,
                        "max_concurrent_rollouts": 2}.items():
        text = re.sub(rf"^{name} = \d+", f"{name} = {value}", text, flags=re.M)
    (folder / "rl.toml").write_text(text)
    return load_config(folder / "rl.toml")


def runners_through(tunnel_url: str, modal_url: str, api_key: str):
    """The kit's runners and `check` against an app behind two proxies at once: rollouts 1
    and 2 through the tunnel, 3 (eval) and a check's rollout through Modal. Returns the
    outcomes (in seed order) and the check's report."""
    from synth_deploy.health import CheckOptions, RolloutOptions, check
    from synth_deploy.runs import PolicyTarget, RunOptions, run_rollouts

    policy = PolicyTarget("http://127.0.0.1:9/v1", "m")

    async def runs():
        return await asyncio.gather(
            run_rollouts(tunnel_url, api_key, [1, 2], policy, RunOptions(concurrency=2)),
            run_rollouts(modal_url, api_key, [3], policy, RunOptions(mode="eval")))

    tunnel_outcomes, modal_outcomes = asyncio.run(runs())
    report = check(modal_url, api_key, CheckOptions(seeds=(1,), rollout=RolloutOptions(
        "http://127.0.0.1:9/v1", "m", timeout_s=30)))
    return tunnel_outcomes + modal_outcomes, report
