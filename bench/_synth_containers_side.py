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


async def surface(op: dict[str, Any]) -> dict[str, Any]:
    """Every `HTTPContainerClient` method, and every route the reference app serves that
    the client has no method for, against ``url``; ``slow_url``: an app whose rollouts
    run for seconds (for terminate). Each answer (or error), with raw routes' status and
    body; the events checked with synth-containers' own `LogEnvelope`; our capabilities
    judged with its own `evaluate_consumer_support`."""
    from dataclasses import fields

    from synth_containers.capabilities import (
        RouteHints,
        RuntimeCapabilitySurface,
        TokenEmissionCapabilities,
    )
    from synth_containers.compatibility import compatibility_matrix, evaluate_consumer_support
    from synth_containers.event_log import LogEnvelope
    from synth_containers.tool_runtime import ToolRuntimeCapabilities

    url, key, payload = op["url"], op["key"], op["payload"]
    rid = payload["rollout_id"]
    raw = httpx.AsyncClient(base_url=url, headers={"X-API-Key": key}, timeout=60.0)
    client = HTTPContainerClient(base_url=url, client=raw, max_retries=0)
    results: dict[str, Any] = {}

    async def route(method: str, path: str, body: Any = None) -> dict[str, Any]:
        resp = await raw.request(method, path, json=body)
        try:
            parsed = resp.json()
        except ValueError:
            parsed = resp.text[:2000]
        return {"status": resp.status_code, "body": parsed}

    try:
        for name, call_ in [
                ("root", client.root), ("health", client.health),
                ("metadata", client.metadata), ("info", client.info),
                ("task_info", client.task_info), ("task_catalog", client.task_catalog),
                ("program", client.program), ("taskset", client.taskset),
                ("compatibility", client.compatibility)]:
            await call(name, results, call_())
        await call("compatibility_target", results,
                   client.compatibility("pipeline_rl_token_ids"))
        await call("taskset_tasks", results, client.taskset_tasks({"split": "train"}))
        await call("taskset_tasks_page", results, client.taskset_tasks(
            {"split": "test", "offset": 2, "limit": 3}))
        await call("rollout", results, client.rollout(dict(payload)))
        failed = {**payload, "rollout_id": rid + "-noinf",
                  "policy": {"model": payload["policy"]["model"]}}
        await call("rollout_failed", results, client.rollout(failed))
        await call("rollouts", results, client.rollouts({**payload, "rollout_id": rid + "-a"}))
        for name in ("get_rollout", "get_state", "summary", "usage", "artifacts",
                     "annotations", "events", "trace"):
            await call(name, results, getattr(client, name)(rid))
        await call("get_rollout_unknown", results, client.get_rollout("never-submitted"))
        for name, call_ in [
                ("pause", lambda: client.pause(rid)),
                ("checkpoint", lambda: client.checkpoint(rid)),
                ("list_rollout_checkpoints", lambda: client.list_rollout_checkpoints(rid)),
                ("get_rollout_checkpoint", lambda: client.get_rollout_checkpoint(rid, "c1")),
                ("list_checkpoints", client.list_checkpoints),
                ("get_checkpoint", lambda: client.get_checkpoint("c1")),
                ("update_checkpoint_labels",
                 lambda: client.update_checkpoint_labels("c1", {"labels": ["x"]})),
                ("resume", lambda: client.resume(rid)), ("fork", lambda: client.fork(rid))]:
            await call(name, results, call_())
        await call("conflict", results, client.rollouts({**payload, "seed": payload["seed"] + 1}))
        # Routes of the reference app the client has no method for: raw answers.
        routes: dict[str, Any] = {}
        for name, method, path, body in [
                ("dataset", "GET", "/dataset", None),
                ("dataset_rows", "POST", "/dataset/rows", {"seeds": [payload["seed"]]}),
                ("unknown_rollout", "GET", "/rollouts/never-submitted", None),
                ("conflict", "POST", "/rollouts", {**payload, "seed": payload["seed"] + 1,
                                                   "submission_mode": "async"}),
                ("prepare_without_telemetry", "POST", "/rollouts/prepare", {"seed": 1}),
                ("prepare", "POST", "/rollouts/prepare",
                 {"rollout_id": rid + "-p", "seed": payload["seed"],
                  "telemetry": {"enabled": True, "transport": "sse"}}),
                ("prepared", "GET", f"/rollouts/{rid}-p", None),
                ("prepared_rollout", "POST", "/rollouts",
                 {**payload, "rollout_id": rid + "-p", "submission_mode": "sync",
                  "telemetry": {"enabled": True, "transport": "sse"}}),
                ("reward_path", "GET", f"/rollouts/{rid}/reward", None),
                ("reward_query", "GET", f"/reward?rollout_id={rid}", None),
                ("reward_post", "POST", "/reward", {"rollout_id": rid}),
                ("export_checkpoint", "GET", "/checkpoints/c1/export", None),
                ("import_checkpoint", "POST", "/checkpoints/import", {}),
                ("resume_async", "POST", f"/rollouts/{rid}/resume_async", {}),
                ("annotations", "GET", f"/rollouts/{rid}/annotations", None),
                ("pause", "POST", f"/rollouts/{rid}/pause", {}),
                ("checkpoints", "GET", "/checkpoints", None)]:
            routes[name] = await route(method, path, body)
        async with raw.stream("GET", f"/rollouts/{rid}/stream",
                              headers={"Last-Event-ID": "1"}) as stream:
            text = "".join([chunk async for chunk in stream.aiter_text()])
        routes["stream"] = {"status": stream.status_code, "body": text[:4000]}
        import websockets  # synth-containers' own dependency

        ws_url = url.replace("http://", "ws://", 1) + f"/rollouts/{rid}/ws"
        try:
            async with websockets.connect(ws_url, additional_headers={"X-API-Key": key},
                                          open_timeout=10):
                routes["ws"] = {"accepted": True}
        except websockets.exceptions.InvalidStatus as exc:
            routes["ws"] = {"accepted": False, "status": exc.response.status_code}
        except Exception as exc:  # noqa: BLE001 - reported
            routes["ws"] = {"error": f"{type(exc).__name__}: {exc}"}
        results["routes"] = routes
        # The events, checked by synth-containers' own envelope reader.
        events = ((results.get("events") or {}).get("value") or {}).get("events") or []
        checked = []
        for event in events:
            try:
                LogEnvelope.from_dict({**event, "event_id": str(event.get("sequence"))})
                checked.append("ok")
            except Exception as exc:  # noqa: BLE001 - reported
                checked.append(f"{type(exc).__name__}: {exc}")
        results["envelopes"] = checked
        # Our /metadata, judged by synth-containers' own consumer requirements.
        caps = ((results.get("metadata") or {}).get("value") or {}).get("capabilities") or {}

        def only(cls: Any, data: dict[str, Any]) -> Any:
            names = {f.name for f in fields(cls)}
            return cls(**{k: v for k, v in (data or {}).items() if k in names})

        try:
            surface_ = only(RuntimeCapabilitySurface, {
                **caps, "token_emission": only(TokenEmissionCapabilities,
                                               caps.get("token_emission")),
                "tool_runtime": only(ToolRuntimeCapabilities, caps.get("tool_runtime")),
                "route_hints": only(RouteHints, caps.get("route_hints"))})
            surface_.validate()
            results["consumer_support"] = evaluate_consumer_support(
                surface_, "pipeline_rl_token_ids").to_dict()
            results["their_matrix"] = {t: r["supported"] for t, r in
                                       compatibility_matrix(surface_).items()}
        except Exception as exc:  # noqa: BLE001 - reported
            results["consumer_support"] = {"error": f"{type(exc).__name__}: {exc}"}
        # The task and its catalog, read into synth-containers' own dataclasses.
        from synth_containers.capabilities import DatasetDescriptor
        from synth_containers.nouns import TaskDefinition

        try:
            info = (results.get("task_info") or {}).get("value") or {}
            catalog = (results.get("task_catalog") or {}).get("value") or {}
            TaskDefinition(**info["task"])
            DatasetDescriptor(**info["dataset"])
            for task in catalog["tasks"]:
                TaskDefinition(**task)
            results["task_shapes"] = "ok"
        except Exception as exc:  # noqa: BLE001 - reported
            results["task_shapes"] = f"{type(exc).__name__}: {exc}"
        if op.get("slow_url"):
            slow = HTTPContainerClient(base_url=op["slow_url"], max_retries=0, client=(
                httpx.AsyncClient(base_url=op["slow_url"], headers={"X-API-Key": key},
                                  timeout=60.0)))
            try:
                await call("slow_submit", results, slow.rollouts(
                    {**payload, "rollout_id": rid + "-slow"}))
                await call("terminate", results, slow.terminate(rid + "-slow",
                                                                {"reason": "bench"}))
                await call("terminated_state", results, slow.get_state(rid + "-slow"))
            finally:
                await slow.aclose()
    finally:
        await client.aclose()
    return results


def main() -> None:
    ops = json.loads(sys.stdin.read())
    handlers = {"drive": drive, "container": container, "surface": surface}
    results = [asyncio.run(handlers[op["op"]](op)) for op in ops]
    print(json.dumps(results, default=str))


if __name__ == "__main__":
    main()
