"""The synth-containers half of bench/synth_containers_fidelity.py: runs in a venv with
synth-containers 0.4.6 (never the project's), drives a URL with synth-containers' own
`HTTPContainerClient`, serves a synth-containers `Container`, and prints JSON.

stdin: a JSON list of operations; stdout (last line): a JSON list of their results.

- ``{"op": "drive", "url", "key", "payload", "other_payload", "poll_s"}``: metadata,
  dataset, rows, a sync rollout, an async rollout (submit → state → events → result),
  a replay of it, a conflicting replay; each call's answer (or error) recorded.
- ``{"op": "container", "origin", "key", "payload", ...}``: the same task served by a
  synth-containers `Container` whose rollout asks ``origin``'s ``/rollout`` (the kit's
  synth-ai endpoint) and answers with synth-containers' own `RolloutResult`; then
  ``drive`` against that container, for the shapes.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import httpx
from synth_containers import Container
from synth_containers.http_client import HTTPContainerClient
from synth_containers.sdk import RolloutResult


async def call(name: str, results: dict[str, Any], coro: Any) -> Any:
    started = time.perf_counter()
    try:
        value = await coro
        results[name] = {"ok": True, "value": value,
                         "ms": round((time.perf_counter() - started) * 1000, 1)}
        return value
    except Exception as exc:  # noqa: BLE001 - recorded for the main side to judge
        results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:1500]}
        return None


async def drive(op: dict[str, Any]) -> dict[str, Any]:
    url, key = op["url"], op["key"]
    raw = httpx.AsyncClient(base_url=url, headers={"X-API-Key": key}, timeout=op.get(
        "timeout_s", 60.0), follow_redirects=True)
    client = HTTPContainerClient(base_url=url, client=raw, max_retries=0)
    results: dict[str, Any] = {}
    payload, other = op["payload"], op["other_payload"]
    try:
        await call("metadata", results, client.metadata())
        await call("taskset", results, client.taskset())

        async def get_json(path: str) -> Any:
            resp = await raw.get(path)
            resp.raise_for_status()
            return resp.json()

        async def post_json(path: str, body: dict[str, Any]) -> Any:
            resp = await raw.post(path, json=body)
            resp.raise_for_status()
            return {"status_code": resp.status_code, "body": resp.json()}

        if not op.get("skip_dataset"):
            await call("dataset", results, get_json("/dataset"))
            await call("rows", results, post_json("/dataset/rows", {"seeds": [payload["seed"]]}))
        sync_payload = {**payload, "rollout_id": payload["rollout_id"] + "-sync"}
        await call("sync", results, client.rollout(sync_payload))
        submitted = await call("async_submit", results, post_json(
            "/rollouts", {**payload, "submission_mode": "async"}))
        if submitted is not None:
            rid = payload["rollout_id"]
            await call("state", results, client.get_state(rid))
            deadline = time.monotonic() + op.get("timeout_s", 60.0)
            polls = 0
            while time.monotonic() < deadline:
                polls += 1
                doc = await client.get_rollout(rid)
                if doc.get("status") not in ("running", "queued", None):
                    break
                await asyncio.sleep(op.get("poll_s", 0.2))
            results["polls"] = polls
            await call("events", results, client.events(rid))
            await call("result", results, client.get_rollout(rid))
            if not op.get("skip_replays"):
                await call("replay", results, client.rollouts(dict(payload)))
                await call("conflict", results, client.rollouts(
                    {**other, "rollout_id": rid}))
    finally:
        await client.aclose()
    return results


async def container(op: dict[str, Any]) -> dict[str, Any]:
    origin, key = op["origin"].rstrip("/"), op["key"]
    app = Container("kit-task-via-container", default_submission_mode="sync")

    @app.rollout
    async def rollout(payload: dict[str, Any]) -> dict[str, Any]:
        policy = payload.get("policy") or {}
        body = {"run_id": payload["rollout_id"], "env": {"seed": payload.get("seed")},
                "policy": {"config": {"model": policy.get("model"),
                                      "inference_url": policy.get("inference_url")}},
                "mode": "eval"}
        async with httpx.AsyncClient(timeout=120) as http:
            resp = await http.post(origin + "/rollout", json=body,
                                   headers={"X-API-Key": key})
        resp.raise_for_status()
        metrics = json.loads(resp.text)["metrics"]
        return RolloutResult(rollout_id=payload["rollout_id"],
                             reward=float(metrics.get("outcome_reward") or 0.0),
                             status="completed", success_status="success").to_dict()

    with app.serve() as running:
        # Its replays start second runs (it keeps no identity): not asked, not compared.
        return await drive({**op, "url": running.url, "skip_dataset": True,
                            "skip_replays": True})


def main() -> None:
    ops = json.loads(sys.stdin.read())
    handlers = {"drive": drive, "container": container}
    results = [asyncio.run(handlers[op["op"]](op)) for op in ops]
    print(json.dumps(results, default=str))


if __name__ == "__main__":
    main()
