"""synth-ai 0.4.4's rules, restated for the fidelity tests (synth-ai itself is never installed).

Each function names the synth-ai code it follows; bench/synth_ai_fidelity.py runs the real
thing when a synth-ai venv is at hand. `write_like_session_tracer` writes a trace database
with the statements synth-ai's ``SessionTracer`` issues through its native manager
(``core/tracing_v3/turso/native_manager.py``): incremental rows, ISO timestamps with a "T",
costs in cents, no columns but its own.
"""

from __future__ import annotations

import json
import sqlite3
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# -- rollouts (sdk/task/validators.py, trace_correlation_helpers.py, eval/runner.py) ---------


def rl_response_issues(response: dict[str, Any]) -> list[str]:
    """`validate_rollout_response_for_rl(response, warn_only=True)`."""
    issues = []
    trace = response.get("trace")
    history = None
    if isinstance(trace, dict):
        history = trace.get("event_history")
        if not history and isinstance(trace.get("session_trace"), dict):
            history = trace["session_trace"].get("event_history")
    has_history = isinstance(history, list) and len(history) > 0
    cid = response.get("trace_correlation_id")
    if not cid and isinstance(trace, dict) and isinstance(trace.get("metadata"), dict):
        cid = trace["metadata"].get("trace_correlation_id")
    if not cid:
        issues.append("Missing trace_correlation_id")
    if not has_history:
        issues.append("trace.event_history is missing or empty")
        meta = response.get("pipeline_metadata")
        url = meta.get("inference_url") if isinstance(meta, dict) else None
        if not url:
            issues.append("pipeline_metadata['inference_url'] is missing")
        elif "?cid=" not in url:
            issues.append("pipeline_metadata['inference_url'] should contain '?cid='")
    return issues


def correlation_verified(response: dict[str, Any], cid: str) -> bool:
    """`verify_trace_correlation_id_in_response`."""
    if response.get("trace_correlation_id") != cid:
        return False
    meta = response.get("pipeline_metadata")
    if not isinstance(meta, dict) or meta.get("trace_correlation_id") != cid:
        return False
    trace = response.get("trace")
    if isinstance(trace, dict):
        found = (trace.get("metadata") or {}).get("trace_correlation_id")
        if found != cid and isinstance(trace.get("session_trace"), dict):
            found = (trace["session_trace"].get("metadata") or {}).get("trace_correlation_id")
        return found == cid
    return True


def eval_runner_tokens(trace: dict[str, Any] | None) -> int:
    """`_count_tokens_from_trace`: what synth-ai's eval runner counts for a rollout."""
    if not trace:
        return 0
    usage = trace.get("usage")
    if isinstance(usage, dict) and usage.get("total_tokens", 0) > 0:
        return usage["total_tokens"]
    total = 0
    for event in trace.get("event_history") or []:
        if isinstance(event, dict):
            total += (event.get("usage") or {}).get("total_tokens", 0)
            total += ((event.get("response") or {}).get("usage") or {}).get("total_tokens", 0)
    return total


def build_trace_payload(messages: list[dict[str, Any]], response: dict[str, Any], *,
                        correlation_id: str | None, session_id: str) -> dict[str, Any]:
    """The trace synth-ai's `build_trace_payload` helper makes (what its apps return)."""
    choice = response["choices"][0]
    metadata: dict[str, Any] = {"session_id": session_id}
    if correlation_id:
        metadata["trace_correlation_id"] = correlation_id
        metadata["correlation_ids"] = {"trace_correlation_id": correlation_id}
    event = {"type": "lm_call", "event_type": "lm_call",
             "timestamp": datetime.now(UTC).isoformat(),
             "llm_request": {"messages": messages},
             "llm_response": {"message": choice["message"], "usage": response.get("usage", {}),
                              "finish_reason": choice.get("finish_reason")}}
    if correlation_id:
        event["correlation_id"] = correlation_id
    return {"schema_version": "3.0", "event_history": [event],
            "markov_blanket_message_history": [], "metadata": metadata}


def session_trace_dict(session_id: str, *, reward: float = 1.0) -> dict[str, Any]:
    """`SessionTrace.to_dict()` of synth-ai's tracing v3, as its server serialises it (ISO
    datetimes; events without ``event_type``; message content as ``{text, json_payload}``)."""
    now = time.time()
    lm = {"system_instance_id": "llm", "time_record": {"event_time": now, "message_time": None},
          "metadata": {"step_id": "turn-1"}, "event_metadata": None, "model_name": "qwen",
          "provider": "openai", "input_tokens": 11, "output_tokens": 3, "total_tokens": 14,
          "cost_usd": 0.001, "latency_ms": 120, "span_id": None, "trace_id": None,
          "system_state_before": None, "system_state_after": None, "call_records": []}
    env = {"system_instance_id": "env", "time_record": {"event_time": now + 1,
                                                        "message_time": None},
           "metadata": {"step_id": "turn-1"}, "event_metadata": None, "reward": reward,
           "terminated": True, "truncated": False, "system_state_before": None,
           "system_state_after": {"score": reward}}
    messages = [
        {"content": {"text": "What is 2 + 2?", "json_payload": None}, "message_type": "user",
         "time_record": {"event_time": now, "message_time": None},
         "metadata": {"step_id": "turn-1"}},
        {"content": {"text": None, "json_payload": '{"answer": 4}'},
         "message_type": "assistant", "time_record": {"event_time": now + 0.5,
                                                      "message_time": None},
         "metadata": {"step_id": "turn-1"}},
    ]
    stamp = datetime.fromtimestamp(now, UTC).isoformat()
    return {"session_id": session_id, "created_at": stamp,
            "session_time_steps": [{"step_id": "turn-1", "step_index": 0, "timestamp": stamp,
                                    "turn_number": 1, "events": [lm, env],
                                    "markov_blanket_messages": messages, "step_metadata": {},
                                    "completed_at": stamp}],
            "event_history": [lm, env], "markov_blanket_message_history": messages,
            "metadata": {"env_name": "crafter", "seed": 7}, "session_metadata": None}


# -- configs (cli/commands/train/validation.py, verifier_validation.py, supported_algos.py) --

_ALGORITHMS = {("online", "policy_gradient", "gspo"), ("offline", "supervised_finetune", "fft"),
               ("offline", "sft", "fft"), ("offline", "sft", "lora")}


def rl_config_problems(raw: dict[str, Any]) -> list[str]:
    """What `validate_rl_config` and `build_rl_payload` refuse (first problem each)."""
    problems = []
    algorithm = raw.get("algorithm") or {}
    if (algorithm.get("type"), algorithm.get("method"), algorithm.get("variety")) \
            not in _ALGORITHMS:
        problems.append("algorithm: unsupported type/method/variety")
    policy, model = raw.get("policy") or {}, raw.get("model") or {}
    if policy:
        if bool(policy.get("model_name")) == bool(policy.get("source")):
            problems.append("[policy]: exactly one of model_name or source")
        for key in ("trainer_mode", "label"):
            if not policy.get(key):
                problems.append(f"[policy].{key} is required")
    if model:
        if bool(model.get("base")) == bool(model.get("source")):
            problems.append("[model]: exactly one of base or source")
        for key in ("trainer_mode", "label"):
            if not model.get(key):
                problems.append(f"[model].{key} is required")
    if not model:  # build_rl_payload reads the model from [model] only
        problems.append("build_rl_payload: [model].base or [model].source is required")
    compute = raw.get("compute") or {}
    if not compute.get("gpu_type") or not compute.get("gpu_count"):
        problems.append("[compute].gpu_type and gpu_count are required")
    rollout = raw.get("rollout") or {}
    for key in ("env_name", "policy_name", "max_turns", "episodes_per_batch",
                "max_concurrent_rollouts"):
        if key not in rollout:
            problems.append(f"[rollout].{key} is required")
    if not (raw.get("topology") or compute.get("topology")):
        problems.append("[topology] or [compute.topology] is required")
    training = raw.get("training") or {}
    for key in ("num_epochs", "iterations_per_epoch", "max_turns", "batch_size", "group_size",
                "learning_rate"):
        if training and key not in training:
            problems.append(f"[training].{key} is required")
    evaluation = raw.get("evaluation") or {}
    for key in ("instances", "every_n_iters", "seeds"):
        if evaluation and key not in evaluation:
            problems.append(f"[evaluation].{key} is required")
    verifier = raw.get("verifier") or {}
    if verifier:
        options = verifier.get("options") or {}
        if {"type", "timeout_s"} & set(verifier):
            problems.append("[verifier] has fields synth-ai refuses")
        if not options or options.get("provider") not in ("openai", "groq", "gemini") \
                or not options.get("model"):
            problems.append("[verifier.options] needs provider and model")
        if {"max_concurrency", "tracks"} & set(options):
            problems.append("[verifier.options] has fields synth-ai refuses")
    return problems


def sft_config_problems(raw: dict[str, Any]) -> list[str]:
    """What `validate_sft_config` refuses."""
    problems = []
    algorithm = raw.get("algorithm") or {}
    if (algorithm.get("type"), algorithm.get("method"), algorithm.get("variety")) \
            not in _ALGORITHMS:
        problems.append("algorithm: unsupported type/method/variety")
    job = raw.get("job") or {}
    if not job.get("model"):
        problems.append("[job].model is required")
    if not (job.get("data") or job.get("data_path")):
        problems.append("[job].data or data_path is required")
    compute = raw.get("compute") or {}
    if not compute.get("gpu_type") or not compute.get("gpu_count"):
        problems.append("[compute].gpu_type and gpu_count are required")
    return problems


# -- SFT data (sdk/learning/sft/data.py) -------------------------------------------------------


def sft_example_problem(example: dict[str, Any]) -> str | None:
    """`coerce_example`: the first error synth-ai raises for one JSONL example, or None."""
    messages = example.get("messages")
    if not isinstance(messages, list) or not messages:
        return "missing messages[] list"
    for i, tool in enumerate(example.get("tools") or []):
        if not isinstance(tool, dict):
            return f"tool {i} is not an object"
        if not isinstance(tool.get("name"), str) or not tool["name"].strip():
            return f"tool {i} missing name"
    for m in messages:
        for j, call in enumerate(m.get("tool_calls") or []):
            fn = call.get("function") if isinstance(call.get("function"), dict) else {}
            if not isinstance(fn.get("name") or call.get("name"), str):
                return f"tool_call {j} missing function name"
    return None


# -- trace files (core/tracing_v3/turso/native_manager.py) -------------------------------------

_SYNTH_AI_TABLES = (
    """CREATE TABLE IF NOT EXISTS session_traces (session_id VARCHAR PRIMARY KEY,
        created_at DATETIME NOT NULL, num_timesteps INTEGER NOT NULL, num_events INTEGER NOT NULL,
        num_messages INTEGER NOT NULL, metadata TEXT, experiment_id VARCHAR, embedding VECTOR)""",
    """CREATE TABLE IF NOT EXISTS session_timesteps (id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id VARCHAR NOT NULL, step_id VARCHAR NOT NULL, step_index INTEGER NOT NULL,
        turn_number INTEGER, started_at DATETIME, completed_at DATETIME, num_events INTEGER,
        num_messages INTEGER, step_metadata TEXT, UNIQUE(session_id, step_id))""",
    """CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id VARCHAR NOT NULL, timestep_id INTEGER, event_type VARCHAR NOT NULL,
        system_instance_id VARCHAR, event_time FLOAT, message_time INTEGER, created_at DATETIME,
        model_name VARCHAR, provider VARCHAR, input_tokens INTEGER, output_tokens INTEGER,
        total_tokens INTEGER, cost_usd INTEGER, latency_ms INTEGER, span_id VARCHAR,
        trace_id VARCHAR, call_records TEXT, reward FLOAT, terminated BOOLEAN, truncated BOOLEAN,
        system_state_before TEXT, system_state_after TEXT, metadata TEXT, event_metadata TEXT,
        embedding VECTOR, CHECK (event_type IN ('cais', 'environment', 'runtime')))""",
    """CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id VARCHAR NOT NULL, timestep_id INTEGER, message_type VARCHAR NOT NULL,
        content TEXT NOT NULL, timestamp DATETIME, event_time FLOAT, message_time INTEGER,
        metadata TEXT, embedding VECTOR)""",
    """CREATE TABLE IF NOT EXISTS outcome_rewards (id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id VARCHAR NOT NULL, total_reward FLOAT NOT NULL,
        achievements_count INTEGER NOT NULL, total_steps INTEGER NOT NULL,
        created_at DATETIME NOT NULL, reward_metadata TEXT, annotation TEXT)""",
    """CREATE TABLE IF NOT EXISTS event_rewards (id INTEGER PRIMARY KEY AUTOINCREMENT,
        event_id INTEGER NOT NULL, session_id VARCHAR NOT NULL, message_id INTEGER,
        turn_number INTEGER, reward_value FLOAT NOT NULL, reward_type VARCHAR, "key" VARCHAR,
        annotation TEXT, source VARCHAR, created_at DATETIME NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS idx_session_created ON session_traces (created_at)",
    "CREATE INDEX IF NOT EXISTS idx_event_model ON events (model_name)",
    "CREATE VIEW IF NOT EXISTS session_summary AS SELECT session_id, num_events "
    "FROM session_traces",
)


def _iso() -> str:
    return datetime.now(UTC).isoformat()


def write_like_session_tracer(path: Path, session_id: str, metadata: dict[str, Any], *,
                              reward: float | None, cost_usd: float = 0.25,
                              start_metadata: dict[str, Any] | None = None) -> None:
    """One session written the way synth-ai's SessionTracer writes it: the schema if missing,
    ``ensure_session`` with the start metadata, then each timestep, event and message row
    with its counter updates, the outcome reward, and ``end_session``'s metadata update."""
    conn = sqlite3.connect(path)
    for ddl in _SYNTH_AI_TABLES:
        conn.execute(ddl)
    conn.execute("INSERT INTO session_traces (session_id, created_at, num_timesteps, "
                 "num_events, num_messages, metadata) VALUES (?, ?, 0, 0, 0, ?) "
                 "ON CONFLICT(session_id) DO NOTHING",
                 (session_id, _iso(), json.dumps(metadata if start_metadata is None
                                                 else start_metadata)))
    step = conn.execute("INSERT INTO session_timesteps (session_id, step_id, step_index, "
                        "turn_number, started_at, completed_at, num_events, num_messages, "
                        "step_metadata) VALUES (?, 'turn-1', 0, 1, ?, NULL, 0, 0, '{}')",
                        (session_id, _iso())).lastrowid
    conn.execute("UPDATE session_traces SET num_timesteps = num_timesteps + 1 "
                 "WHERE session_id = ?", (session_id,))

    def message(kind: str, text: str) -> None:
        conn.execute("INSERT INTO messages (session_id, timestep_id, message_type, content, "
                     "event_time, message_time, metadata) VALUES (?, ?, ?, ?, ?, NULL, ?)",
                     (session_id, step, kind, text, time.time(), '{"step_id":"turn-1"}'))
        conn.execute("UPDATE session_traces SET num_messages = num_messages + 1 "
                     "WHERE session_id = ?", (session_id,))

    message("user", "What is 3 + 4?")
    conn.execute("INSERT INTO events (session_id, timestep_id, event_type, system_instance_id, "
                 "event_time, model_name, input_tokens, output_tokens, total_tokens, cost_usd, "
                 "metadata) VALUES (?, ?, 'cais', 'llm', ?, 'qwen', 9, 2, 11, ?, ?)",
                 (session_id, step, time.time(), int(cost_usd * 100), '{"step_id":"turn-1"}'))
    conn.execute("UPDATE session_traces SET num_events = num_events + 1 WHERE session_id = ?",
                 (session_id,))
    message("assistant", "7")
    if reward is not None:
        conn.execute("INSERT INTO outcome_rewards (session_id, total_reward, achievements_count,"
                     " total_steps, created_at, reward_metadata, annotation) VALUES "
                     "(?, ?, 1, 1, ?, '{}', NULL)", (session_id, reward, _iso()))
    conn.execute("UPDATE session_traces SET metadata = ? WHERE session_id = ?",
                 (json.dumps(metadata), session_id))
    conn.execute("UPDATE session_traces SET num_timesteps = ?, num_events = ?, num_messages = ?,"
                 " metadata = ? WHERE session_id = ?", (1, 1, 2, json.dumps(metadata),
                                                        session_id))
    conn.commit()
    conn.close()
