"""Fidelity with synth-containers 0.4.6, judged by its own client. Needs a throwaway venv
with synth-containers (never the project's dependency, never CI):

    python -m venv /tmp/sc-venv && /tmp/sc-venv/bin/pip install synth-containers==0.4.6
    python bench/synth_containers_fidelity.py /tmp/sc-venv/bin/python

Prints one line per check, ok or FAIL with what differs, and exits 1 on any FAIL. For the
math and crafter apps served by the kit (the mock policy behind them), synth-containers'
``HTTPContainerClient`` at ``{app}/containers``:

  metadata, dataset, rows   the contract version, async advertised; splits; a row per seed
  sync                      ``client.rollout``: completed, with a reward
  async                     202 → ``get_state`` running → ``events`` → ``get_rollout``
                            completed with the sync rollout's reward
  replay, conflict          the same id and body: ``replayed: true``, no second run; the
                            same id with another body: 409
  shapes                    the same task served by a synth-containers ``Container`` (its
                            rollout asks the app's ``/rollout``), driven the same way: every
                            key its metadata, sync result, async submission, state and
                            result have, ours have too, with the same JSON type
  long                      an 8-s rollout (ten minutes, scaled) through the strict Modal
                            front end (303 after 3 s) and Cloudflare's edge (2 s of
                            silence), tests/standins/cutoff_proxies.py: the client's async
                            path completes, polled every 0.5 s, with no redirect and no cut

The synth-containers half runs in that venv (bench/_synth_containers_side.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from synth_deploy.runs import create_mock_policy_app
from synth_deploy.serving import BackgroundServer, RolloutLimits, create_app
from synth_deploy.taskapp import RolloutContext, RolloutRequest, TaskDescriptor, TaskInfo
from synth_deploy.taskapp.config import TaskAppConfig
from synth_deploy.taskapp.registry import load_app
from synth_deploy.tracing import RolloutRecords, open_trace_store

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from standins.cutoff_proxies import EdgeProxy, StrictModalFrontEnd  # noqa: E402

KEY = "sk_env_containers_bench"
failures: list[str] = []


def report(name: str, ok: bool, detail: Any = "") -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' if detail else ''}{detail}")
    if not ok:
        failures.append(name)


def side(python: str, *ops: dict[str, Any]) -> list[Any]:
    proc = subprocess.run([python, str(ROOT / "bench" / "_synth_containers_side.py")],
                          input=json.dumps(list(ops)), capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"the synth-containers side failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def missing_shapes(ours: Any, theirs: Any, path: str) -> list[str]:
    """What ``theirs`` has that ``ours`` lacks or types differently (ours may have more)."""
    if isinstance(theirs, dict):
        if not isinstance(ours, dict):
            return [f"{path}: ours is {type(ours).__name__}, theirs an object"]
        found = []
        for key, value in theirs.items():
            if key not in ours:
                found.append(f"{path}.{key} missing")
            elif value is not None and ours[key] is not None:
                found += missing_shapes(ours[key], value, f"{path}.{key}")
        return found
    if theirs is None or ours is None or type(ours) is type(theirs) or \
            {type(ours), type(theirs)} <= {int, float}:
        return []
    return [f"{path}: ours {type(ours).__name__}, theirs {type(theirs).__name__}"]


def payload(rollout_id: str, seed: int, policy_url: str) -> dict[str, Any]:
    return {"rollout_id": rollout_id, "seed": seed, "mode": "eval",
            "policy": {"model": "mock-policy", "inference_url": policy_url}}


def value(results: dict[str, Any], name: str) -> Any:
    entry = results.get(name) or {}
    return entry.get("value") if entry.get("ok") else None


def error(results: dict[str, Any], name: str) -> str:
    entry = results.get(name)
    if not isinstance(entry, dict):
        return ""
    return entry.get("error", "") if not entry.get("ok") else ""


def check_app(python: str, name: str, config: TaskAppConfig, seed: int, policy_url: str,
              tmp: Path) -> None:
    with open_trace_store(str(tmp / f"{name}.db")) as store, \
            BackgroundServer(create_app(config, api_keys=[KEY], trace_store=store,
                                        rollout_records=RolloutRecords(store))) as app:
        ours, theirs = side(python, {
            "op": "drive", "url": app.url + "/containers", "key": KEY,
            "payload": payload(f"{name}-fid-1", seed, policy_url),
            "other_payload": payload("x", seed + 1, policy_url)}, {
            "op": "container", "origin": app.url, "key": KEY,
            "payload": payload(f"{name}-fid-c", seed, policy_url),
            "other_payload": payload("x", seed + 1, policy_url)})
        stored = {s.run_id for s in store.list_sessions(limit=None)}
    meta = value(ours, "metadata") or {}
    caps = meta.get("capabilities") or {}
    report(f"{name} metadata", caps.get("contract_version") == "2026-05-28"
           and "async" in (caps.get("rollout_modes") or []),
           error(ours, "metadata") or f"{caps.get('protocol')} {caps.get('contract_version')}")
    dataset = value(ours, "dataset") or {}
    report(f"{name} dataset", bool(dataset.get("splits")),
           error(ours, "dataset") or dataset.get("splits"))
    rows = ((value(ours, "rows") or {}).get("body") or {}).get("rows") or []
    report(f"{name} rows", [r.get("seed") for r in rows] == [seed],
           error(ours, "rows") or f"{len(rows)} row(s)")
    sync = value(ours, "sync") or {}
    reward = (sync.get("reward_info") or {}).get("outcome_reward")
    report(f"{name} sync rollout", sync.get("status") == "completed" and reward is not None,
           error(ours, "sync") or f"status={sync.get('status')} reward={reward}")
    submitted = value(ours, "async_submit") or {}
    state = value(ours, "state") or {}
    events = [e.get("kind") for e in (value(ours, "events") or {}).get("events") or []]
    result = value(ours, "result") or {}
    async_reward = (result.get("reward_info") or {}).get("outcome_reward")
    report(f"{name} async rollout", submitted.get("status_code") == 202
           and state.get("status") in ("running", "completed")
           and events[:1] == ["rollout.accepted"] and events[-1:] == ["rollout.completed"]
           and result.get("status") == "completed" and async_reward == reward,
           error(ours, "async_submit") or f"202 → state {state.get('status')} → events "
           f"{events} → {result.get('status')} (reward {async_reward}, {ours.get('polls')} "
           "polls)")
    replay = value(ours, "replay") or {}
    report(f"{name} replay", replay.get("replayed") is True
           and replay.get("updated_at") == result.get("updated_at"),
           error(ours, "replay") or f"replayed={replay.get('replayed')}")
    conflict = error(ours, "conflict")
    report(f"{name} conflicting replay", "409" in conflict, conflict[:120])
    report(f"{name} traced", {f"{name}-fid-1", f"{name}-fid-1-sync"} <= stored,
           sorted(stored))
    problems: list[str] = []
    for part in ("metadata", "sync", "state", "result"):
        problems += missing_shapes(value(ours, part), value(theirs, part), part)
    problems += missing_shapes((value(ours, "async_submit") or {}).get("body"),
                               (value(theirs, "async_submit") or {}).get("body"), "async_submit")
    compared = [p for p in ("metadata", "sync", "state", "result", "async_submit")
                if value(theirs, p) is not None]
    report(f"{name} shapes vs a synth-containers Container", not problems and len(compared) == 5,
           "; ".join(problems[:8]) or f"{', '.join(compared)} as theirs "
           f"(theirs failed: {[k for k in theirs if error(theirs, k)]})")


def sleeping_config() -> TaskAppConfig:
    async def rollout(request: RolloutRequest, ctx: RolloutContext) -> dict:
        await asyncio.sleep(8.0)
        ctx.tracer.record_outcome_reward(1.0)
        return {"run_id": request.run_id, "metrics": {}}

    def instances(seeds):
        return [TaskInfo(task=TaskDescriptor(id="long", name="Long")) for _ in seeds]

    return TaskAppConfig(app_id="long", name="Long", description="an 8-s rollout",
                         base_task_info=TaskInfo(task=TaskDescriptor(id="long", name="Long")),
                         provide_task_instances=instances, rollout=rollout)


def check_long(python: str, tmp: Path) -> None:
    limits = RolloutLimits(head_after_s=0.5, heartbeat_s=0.5)
    with open_trace_store(str(tmp / "long.db")) as store, \
            BackgroundServer(create_app(sleeping_config(), api_keys=[KEY], trace_store=store,
                                        rollout_records=RolloutRecords(store),
                                        limits=limits)) as app, \
            StrictModalFrontEnd(app.url, redirect_after_s=3.0) as modal, \
            EdgeProxy(app.url, silence_s=2.0) as edge:
        runs = side(python, *({"op": "drive", "url": proxy.url + "/containers", "key": KEY,
                               "payload": payload(f"long-{name}", 1, "http://127.0.0.1:9/v1"),
                               "other_payload": payload("x", 2, "http://127.0.0.1:9/v1"),
                               "poll_s": 0.5, "skip_dataset": True, "timeout_s": 60.0}
                              for name, proxy in (("modal", modal), ("edge", edge))))
        stored = {s.run_id for s in store.list_sessions(limit=None)}
        for (name, proxy), results in zip((("modal", modal), ("edge", edge)), runs,
                                          strict=True):
            result = value(results, "result") or {}
            sync_error = error(results, "sync")
            report(f"long via {name}: async path", result.get("status") == "completed"
                   and f"long-{name}" in stored,
                   f"{result.get('status')} after {results.get('polls')} polls, traced="
                   f"{f'long-{name}' in stored}")
            said = (f"redirects={getattr(proxy, 'redirects', 0)} "
                    f"cut={getattr(proxy, 'cut', 0)}; the same rollout sync: "
                    f"{'completed' if not sync_error else sync_error[:90]}")
            print(f"     (as found) {name}: {said}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("python", help="a python with synth-containers 0.4.6 installed")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, \
            BackgroundServer(create_mock_policy_app()) as policy:
        policy_url = policy.url + "/v1"
        for name, seed in (("math", 1), ("crafter", 1)):
            check_app(args.python, name, load_app(name).build_config(), seed, policy_url,
                      Path(tmp))
        check_long(args.python, Path(tmp))
    print(f"{len(failures)} failed" if failures else "all passed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
