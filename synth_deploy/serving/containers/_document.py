"""A rollout's document in the contract's terms, and the views of it the contract's routes
answer (state, summary, usage, trace, reward, artifacts).

A completed rollout's fields (`result_fields`) carry, beside the kit's own answer
(``response``, a synth-ai RolloutResponse): its ``trace`` (the session, when the rollout was
traced into its answer: asked with ``record.return_trace``, or its tokens captured), the
token ids and log-probabilities of each policy call as the contract's ``turns``, and its
trajectories as ``artifacts``. The trace is kept once, at the top: the kit's answer gets it
back from there (`rollout_answer`).
"""

from __future__ import annotations

from typing import Any

from synth_deploy.tracing import shared_prefix

# What the kit can do to a running rollout (the state's ``control``).
CONTROL = {"pause_supported": False, "terminate_supported": True, "resume_supported": False,
           "checkpoint_supported": False}


def result_fields(answer: dict[str, Any], rollout_id: str) -> dict[str, Any]:
    """A completed rollout's answer (``response`` and the fields made from it) with the
    contract's ``trace``, ``turns``, ``artifacts`` and summary filled in."""
    response = dict(answer["response"])
    trace = response.pop("trace", None) or answer.get("trace") or {}
    metrics = response.get("metrics") or {}
    reward = metrics.get("outcome_reward")
    return {**answer, "response": response, "trace": trace,
            "trace_correlation_id": answer.get("trace_correlation_id") or rollout_id,
            "turns": token_turns(trace),
            "summary": {**(answer.get("summary") or {}), "outcome_reward": reward},
            "artifacts": [{"artifact_id": f"{rollout_id}:trajectory:{i}", "kind": "trajectory",
                           "artifact_type": "trajectory", "rollout_id": rollout_id,
                           "uri": f"rollouts/{rollout_id}/response/trajectories/{i}",
                           "step_count": len(t.get("steps") or ()), "outcome_reward": reward}
                          for i, t in enumerate(response.get("trajectories") or ())]}


# How a list that begins with the one before it under the same key is stored: how many
# items it shares with that one, and the rest (keys no producer of ours writes).
_SHARED, _REST = "\u0000shared", "\u0000rest"
_MARKER = {_SHARED, _REST}
# Lists shorter than this, or sharing fewer items, are stored whole: not worth a marker.
_WORTH = 8
# A trace's histories: its steps' lists end to end (`SessionTrace.to_dict`), and what the
# record holds in a history's place.
_HISTORIES = {"event_history": "events",
              "markov_blanket_message_history": "markov_blanket_messages"}
_JOINED = "\u0000joined"


def compact(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` as a rollout's record keeps it. A trace returned whole grows with the
    square of an episode's turns (each step holds the conversation so far); its record
    grows with the turns:

    - each list that begins with the last list seen under the same key (a policy call's
      prompt ids and messages are the call before's and more) is kept as what it adds;
    - a trace's histories, its steps' lists end to end, are kept once, in the steps.

    `expanded` undoes it."""
    trace = document.get("trace")
    if isinstance(trace, dict):
        steps = trace.get("session_time_steps")
        joined = [name for name, part in _HISTORIES.items()
                  if isinstance(steps, list) and trace.get(name) == _joined(steps, part)]
        if joined:
            document = {**document, "trace": {**trace, **dict.fromkeys(joined, _JOINED)}}
    return _walk(document, None, {}, _compact_list)


def expanded(document: dict[str, Any]) -> dict[str, Any]:
    """`compact` undone."""
    document = _walk(document, None, {}, _expand_list)
    trace = document.get("trace")
    if isinstance(trace, dict):
        for name, part in _HISTORIES.items():
            if trace.get(name) == _JOINED:
                trace[name] = _joined(trace["session_time_steps"], part)
    return document


def _joined(steps: list[Any], part: str) -> list[Any]:
    return [item for step in steps if isinstance(step, dict)
            for item in (step.get(part) or ())]


def _walk(value: Any, key: Any, before: dict[Any, list[Any]], on_list: Any) -> Any:
    # Depth first, in the dicts' order: both ways see the lists in the same order.
    if isinstance(value, dict):
        if on_list is _expand_list and value.keys() == _MARKER:
            return _expand_list(value, key, before)
        return {k: _walk(v, k, before, on_list) for k, v in value.items()}
    if isinstance(value, list):
        return on_list(value, key, before)
    return value


def _compact_list(items: list[Any], key: Any, before: dict[Any, list[Any]]) -> Any:
    last = before.get(key)
    shared = shared_prefix(last, items) if last is not None and len(items) >= _WORTH else 0
    if shared < _WORTH:
        shared = 0
    rest = [_walk(v, key, before, _compact_list) for v in items[shared:]]
    before[key] = items
    return {_SHARED: shared, _REST: rest} if shared else rest


def _expand_list(marked: Any, key: Any, before: dict[Any, list[Any]]) -> list[Any]:
    last = before.get(key) or []
    shared, rest = (marked[_SHARED], marked[_REST]) if isinstance(marked, dict) else (0, marked)
    items = last[:shared] + [_walk(v, key, before, _expand_list) for v in rest]
    before[key] = items
    return items


def token_turns(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """Each policy call of ``trace`` that recorded tokens, as the contract's training turn:
    ``prompt_token_ids``, ``token_ids`` (the completion's), ``token_logprobs``."""
    turns = []
    for event in trace.get("event_history") or ():
        tokens = event.get("tokens") if isinstance(event, dict) else None
        if not isinstance(tokens, dict) or not tokens.get("completion_ids"):
            continue
        turn = {"turn_index": len(turns), "prompt_token_ids": tokens.get("prompt_ids") or [],
                "token_ids": tokens["completion_ids"], "model": tokens.get("model"),
                "trainable": True}
        if tokens.get("completion_logprobs"):
            turn["token_logprobs"] = tokens["completion_logprobs"]
            turn["assistant_sequence_logprob"] = sum(tokens["completion_logprobs"])
        turns.append(turn)
    return turns


def state_view(document: dict[str, Any]) -> dict[str, Any]:
    """``GET .../state``: where the rollout is, what can be done to it, how far it got."""
    summary = document.get("summary") or {}
    keep = ("rollout_id", "trace_correlation_id", "status", "success_status", "created_at",
            "updated_at", "summary", "metadata", "lease", "error")
    return {**{k: document[k] for k in keep if k in document},
            "status_detail": document.get("status_detail") or document["status"],
            "checkpoint_available": False, "checkpoint": None, "control": dict(CONTROL),
            "resume_semantics": {"mode": "unsupported", "checkpoint_semantics": "none",
                                 "supports_branching": False,
                                 "true_environment_snapshot": False},
            "progress": {"step_count": summary.get("num_steps") or 0,
                         "reward": summary.get("outcome_reward", summary.get("reward"))},
            "artifacts": document.get("artifacts") or []}


def summary_view(document: dict[str, Any]) -> dict[str, Any]:
    return {"rollout_id": document["rollout_id"],
            "trace_correlation_id": document.get("trace_correlation_id"),
            "summary": document.get("summary") or {},
            "outcome_reward": (document.get("reward_info") or {}).get("outcome_reward"),
            "parent_rollout_id": None, "parent_checkpoint_id": None}


def usage_view(document: dict[str, Any]) -> dict[str, Any]:
    """The rollout's usage: its token total, and its ledger's figures when it has one."""
    usage = dict(document.get("usage") or {})
    ledger = (((document.get("response") or {}).get("metrics") or {}).get("details")
              or {}).get("ledger")
    if isinstance(ledger, dict):
        usage.update({k: v for k, v in ledger.items() if k != "rollouts"})
    return {"rollout_id": document["rollout_id"],
            "trace_correlation_id": document.get("trace_correlation_id"), "usage": usage}


def trace_view(document: dict[str, Any]) -> dict[str, Any]:
    return {"rollout_id": document["rollout_id"], **(document.get("trace") or {})}


def artifacts_view(document: dict[str, Any]) -> dict[str, Any]:
    return {"rollout_id": document["rollout_id"], "artifacts": document.get("artifacts") or []}


def reward_view(document: dict[str, Any]) -> dict[str, Any]:
    """The rollout's reward as the contract's reward record: ``scored`` once it has one,
    ``absent`` otherwise (running, failed, or no reward given)."""
    rollout_id = document["rollout_id"]
    reward = (document.get("reward_info") or {}).get("outcome_reward")
    if reward is None:
        return {"status": "absent", "reward": None, "rollout_id": rollout_id}
    return {"execution_id": f"eval_{rollout_id}", "rollout_id": rollout_id,
            "status": "scored", "reward": reward,
            "node_results": [{"node_id": "env_reward", "kind": "env_reward",
                              "authority": "environment", "status": "scored",
                              "value": reward}]}


__all__ = ["CONTROL", "artifacts_view", "compact", "expanded", "result_fields", "reward_view",
           "state_view", "summary_view", "token_turns", "trace_view", "usage_view"]
