"""The synth-ai half of bench/synth_ai_fidelity.py: runs in a synth-ai 0.4.4 venv, never here.

Reads a JSON list of operations on stdin, runs each with synth-ai's own code and prints one
JSON list of results (an ``{"error": ...}`` for an operation that raised). It imports nothing
from synth_deploy: what it reports is synth-ai's verdict alone.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any


def rollout(url: str, api_key: str, inference_url: str, seed: int) -> dict[str, Any]:
    """A trainer's rollout request (trace asked for), judged by synth-ai's validators."""
    import httpx
    from synth_ai.cli.commands.eval.runner import _count_tokens_from_trace
    from synth_ai.sdk.task.contracts import RolloutResponse
    from synth_ai.sdk.task.trace_correlation_helpers import (
        extract_trace_correlation_id,
        verify_trace_correlation_id_in_response,
    )
    from synth_ai.sdk.task.validators import validate_rollout_response_for_rl

    config = {"model": "mock", "inference_url": inference_url}
    cid = extract_trace_correlation_id(config, inference_url, "rl")
    body = {"run_id": f"fidelity-{seed}", "env": {"seed": seed, "config": {}},
            "policy": {"policy_name": "mock", "config": config},
            "record": {"return_trace": True, "trace_format": "structured"}, "mode": "rl"}
    resp = httpx.post(url.rstrip("/") + "/rollout", json=body, headers={"X-API-Key": api_key},
                      timeout=60)
    data = resp.json()
    parsed = RolloutResponse.model_validate(data).model_dump()
    return {"status": resp.status_code, "cid": cid,
            "rl_issues": validate_rollout_response_for_rl(parsed, warn_only=True),
            "correlated": verify_trace_correlation_id_in_response(parsed, cid, body["run_id"]),
            "tokens": _count_tokens_from_trace(parsed.get("trace"))}


def client_rollouts(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rollouts sent at once, each by synth-ai's own `TaskAppClient` (its retries, timeout
    and redirect rule): what the trainer's client makes of each answer."""
    from synth_ai.sdk.task.client import TaskAppClient
    from synth_ai.sdk.task.contracts import RolloutRequest

    async def one(call: dict[str, Any]) -> dict[str, Any]:
        request = RolloutRequest.model_validate({
            "run_id": call["run_id"], "env": {"seed": 1, "config": {}},
            "policy": {"policy_name": "p", "config": {
                "model": "m", "inference_url": "http://127.0.0.1:9/v1"}},
            "mode": "rl"})
        started = time.monotonic()
        try:
            async with TaskAppClient(call["url"], call["api_key"]) as client:
                response = await client.rollout(request)
        except Exception as exc:  # what the trainer would see, reported
            return {"run_id": call["run_id"], "error": f"{type(exc).__name__}: {exc}"[:300],
                    "seconds": round(time.monotonic() - started, 1)}
        return {"run_id": response.run_id, "reward": response.metrics.outcome_reward,
                "seconds": round(time.monotonic() - started, 1)}

    async def all_at_once() -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(one(c) for c in calls)))

    return asyncio.run(all_at_once())


def validate_config(path: str, kind: str) -> dict[str, Any]:
    import tomllib

    from synth_ai.cli.commands.train.validation import validate_rl_config, validate_sft_config

    raw = tomllib.loads(Path(path).read_text())
    (validate_rl_config if kind == "rl" else validate_sft_config)(raw)
    return {"ok": True}


def rl_payload(path: str, task_url: str) -> dict[str, Any]:
    from synth_ai.sdk.api.train.builders import build_rl_payload

    return build_rl_payload(config_path=Path(path), task_url=task_url, overrides={},
                            idempotency=None).payload


def sft_payload(path: str) -> dict[str, Any]:
    from synth_ai.sdk.api.train.builders import build_sft_payload

    os.chdir(Path(path).parent)  # synth-ai resolves the dataset from the working directory
    return build_sft_payload(config_path=Path(path), dataset_override=None,
                             allow_experimental=None).payload


def shipped_configs() -> list[str]:
    import synth_ai

    root = Path(synth_ai.__file__).parent / "cli" / "demo_apps"
    return sorted(str(p) for p in root.rglob("*.toml") if "prompt_learning" not in p.read_text())


def write_sessions(db: str, count: int, reward: float, env_name: str) -> list[str]:
    """Sessions as synth-ai's SessionTracer writes them (incrementally, then on end)."""
    from synth_ai.core.tracing_v3.abstractions import EnvironmentEvent, LMCAISEvent, TimeRecord
    from synth_ai.core.tracing_v3.session_tracer import SessionTracer

    async def main() -> list[str]:
        tracer = SessionTracer(db_url=f"sqlite+aiosqlite:///{db}")
        await tracer.initialize()
        ids = []
        for i in range(count):
            await tracer.start_session(metadata={"env_name": env_name, "seed": i,
                                                 "model": "qwen", "run_id": f"sai-{i}"})
            await tracer.start_timestep("turn-1", turn_number=1)
            await tracer.record_message(f"What is {i} + {i}?", "user")
            await tracer.record_event(LMCAISEvent(
                system_instance_id="llm", time_record=TimeRecord(event_time=time.time()),
                model_name="qwen", input_tokens=5, output_tokens=2, total_tokens=7,
                cost_usd=0.25))
            await tracer.record_message(str(2 * i), "assistant")
            await tracer.record_event(EnvironmentEvent(
                system_instance_id="env", time_record=TimeRecord(event_time=time.time()),
                reward=reward, terminated=True))
            await tracer.record_outcome_reward(total_reward=reward, achievements_count=1,
                                               total_steps=1)
            ids.append((await tracer.end_session()).session_id)
        await tracer.close()
        return ids

    return asyncio.run(main())


def read_sessions(db: str) -> list[dict[str, Any]]:
    """Every session of ``db`` as synth-ai's readers take it: its trace manager's
    `get_session_trace`, `trace_utils.load_session_trace`, and `synth-ai filter`'s query of
    the messages and its pairing of them into examples."""

    from synth_ai.cli.commands.filter.core import _select_messages
    from synth_ai.core.tracing_v3 import trace_utils
    from synth_ai.core.tracing_v3.turso.native_manager import NativeLibsqlTraceManager

    async def main() -> list[dict[str, Any]]:
        manager = NativeLibsqlTraceManager(f"sqlite+aiosqlite:///{db}")
        await manager.initialize()
        ids = [r["session_id"] for r in (await manager.query_traces(
            "SELECT session_id FROM session_traces")).to_dict("records")]
        out = []
        conn = trace_utils.connect(db)
        for sid in ids:
            trace = await manager.get_session_trace(sid)
            loaded = trace_utils.load_session_trace(conn, sid)
            rows = (await manager.query_traces(
                "SELECT message_type, content, timestamp FROM messages WHERE session_id = "
                ":session_id ORDER BY timestamp ASC, id ASC", {"session_id": sid}
            )).to_dict("records")
            out.append({"session_id": sid, "timesteps": len(trace["timesteps"]),
                        "num_messages": trace["num_messages"],
                        "loaded_messages": len(loaded["markov_blanket_message_history"]),
                        "loaded_events": len(loaded["event_history"]),
                        "filter_examples": len(_select_messages(rows))})
        conn.close()
        await manager.close()
        return out

    return asyncio.run(main())


def validate_sft(path: str) -> list[str]:
    from synth_ai.sdk.learning.sft.data import collect_sft_jsonl_errors

    return collect_sft_jsonl_errors(Path(path))


def example_tomls(folder: str) -> list[str]:
    """Every TOML synth-ai ships: its package's .toml files, and the ```toml blocks of its
    config models' docstrings (written under ``folder``)."""
    import re

    import synth_ai

    root = Path(synth_ai.__file__).parent
    found = sorted(str(p) for p in root.rglob("*.toml"))
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    for module in sorted((root / "sdk" / "api" / "train" / "configs").glob("*.py")):
        for i, block in enumerate(re.findall(r"```toml\n(.*?)```", module.read_text(), re.S)):
            lines = block.splitlines()
            indent = min((len(x) - len(x.lstrip()) for x in lines if x.strip()), default=0)
            path = out / f"docstring_{module.stem}_{i}.toml"
            path.write_text("\n".join(x[indent:] for x in lines) + "\n")
            found.append(str(path))
    return found


def write_tomls(files: list[dict[str, Any]]) -> list[str]:
    """Each ``{"path", "data"}`` written as TOML (synth-ai's venv has a TOML writer)."""
    import tomli_w

    for file in files:
        Path(file["path"]).write_bytes(tomli_w.dumps(file["data"]).encode())
    return [file["path"] for file in files]


OPERATIONS = {f.__name__: f for f in (rollout, client_rollouts, validate_config, rl_payload,
                                      sft_payload, shipped_configs, example_tomls, write_tomls,
                                      write_sessions, read_sessions, validate_sft)}


def main() -> None:
    out = sys.stdout
    sys.stdout = sys.stderr  # synth-ai prints while importing: keep the JSON channel clean
    results = []
    for op in json.loads(sys.stdin.read()):
        try:
            results.append(OPERATIONS[op["op"]](**op.get("args", {})))
        except Exception as exc:
            said = " ".join(str(part) for part in (exc, getattr(exc, "detail", None),
                                                   getattr(exc, "hint", None)) if part)
            results.append({"error": f"{type(exc).__name__}: {said}",
                            "trace": traceback.format_exc()[-800:]})
    out.write(json.dumps(results, default=str) + "\n")


if __name__ == "__main__":
    main()
