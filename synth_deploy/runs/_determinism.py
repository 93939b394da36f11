"""Determinism: the same seed twice gives the same task instance and, with a deterministic
policy, the same trajectory and reward. A trainer that compares group members assumes both.

What differs is reported as the first difference, by path (``task_metadata.question:
'What is 3 + 4?' ≠ 'What is 8 + 1?'``). Values that differ on every call by design (run ids,
trace ids, timestamps and timings such as ``metrics.details.ledger.env_s``) are left out.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from synth_deploy.env import redact
from synth_deploy.runs._rollouts import admitted, transport_error
from synth_deploy.serving import answered_status
from synth_deploy.serving.containers import AdmissionWaits
from synth_deploy.tls import client_ssl_context

VOLATILE_KEYS = frozenset({
    "run_id", "session_id", "id", "event_id", "message_id", "trace_correlation_id", "request",
    "timestamp",
})
# Timings, whatever their name: ``env_s``, ``latency_ms``, ``created_at``, ``event_time``...
_TIMING = re.compile(r"(_s|_ms|_ns|_seconds|_at|_time)$|latency|duration|elapsed")


def _volatile(key: object) -> bool:
    return key in VOLATILE_KEYS or bool(_TIMING.search(str(key)))
_SHOWN = 60


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """Where ``a`` and ``b`` first differ (``path: a ≠ b``), or None when they match."""
    where = path or "(top)"
    if isinstance(a, dict) and isinstance(b, dict):
        return _dict_difference(a, b, path)
    if isinstance(a, list) and isinstance(b, list):
        return _list_difference(a, b, path, where)
    return None if _same_value(a, b) else f"{where}: {_short(a)} ≠ {_short(b)}"


def _same_value(a: Any, b: Any) -> bool:
    """Equal, numbers within rounding (a float sum may differ in its last bits)."""
    if isinstance(a, float | int) and isinstance(b, float | int) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def _dict_difference(a: dict[Any, Any], b: dict[Any, Any], path: str) -> str | None:
    """The first key (in sorted order, volatile ones left out) whose values differ, or that
    only one side has."""
    for key in sorted(set(a) | set(b), key=str):
        if _volatile(key):
            continue
        sub = f"{path}.{key}" if path else str(key)
        if key not in a or key not in b:
            return f"{sub}: only in the {'second' if key not in a else 'first'} answer"
        found = first_difference(a[key], b[key], sub)
        if found:
            return found
    return None


def _list_difference(a: list[Any], b: list[Any], path: str, where: str) -> str | None:
    """The first item that differs, else the lengths when they do."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        found = first_difference(x, y, f"{path}[{i}]")
        if found:
            return found
    if len(a) != len(b):
        return f"{where}: {len(a)} items ≠ {len(b)} items"
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN - 1] + "…"


@dataclass
class DeterminismResult:
    """Two `/task_info` reads and two rollouts of one seed, compared."""

    seed: int
    task_info_difference: str | None = None
    rollout_difference: str | None = None
    rewards: tuple[float | None, float | None] = (None, None)
    error: str | None = None
    policy_deterministic: bool = True  # the mock at temperature 0; a real endpoint may not be
    seed_ignored: str | None = None  # the episode's note: its environment's reset takes no seed

    @property
    def deterministic(self) -> bool:
        return not (self.error or self.task_info_difference or self.rollout_difference)

    def to_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "deterministic": self.deterministic,
                "task_info_difference": self.task_info_difference,
                "rollout_difference": self.rollout_difference, "rewards": list(self.rewards),
                "policy_deterministic": self.policy_deterministic,
                "seed_ignored": self.seed_ignored, "error": self.error}


def _comparable(answer: dict[str, Any]) -> dict[str, Any]:
    """What a rollout produced: its metrics and trajectories (else its trace's messages)."""
    picked = {"metrics": answer.get("metrics"), "trajectories": answer.get("trajectories")}
    if not picked["trajectories"] and isinstance(answer.get("trace"), dict):
        trace = answer["trace"]
        picked["messages"] = trace.get("markov_blanket_message_history")
        picked["event_rewards"] = trace.get("event_rewards")
    return picked


def _reward(answer: dict[str, Any]) -> float | None:
    metrics = answer.get("metrics") or {}
    for name in ("outcome_reward", "reward_mean", "mean_return"):
        if isinstance(metrics.get(name), int | float):
            return float(metrics[name])
    return None


async def check_determinism(base_url: str, api_key: str, seed: int,
                            body_for: Callable[[str], dict[str, Any]], *, timeout_s: float,
                            policy_deterministic: bool = True,
                            secrets: tuple[str, ...] = ()) -> DeterminismResult:
    """Read ``/task_info?seed=`` twice and run ``body_for(run_id)`` twice, one after the other
    (the body asks for the same seed, a temperature of 0 and the same correlation id)."""
    result = DeterminismResult(seed, policy_deterministic=policy_deterministic)
    hidden = [api_key, *secrets]
    async with httpx.AsyncClient(base_url=base_url.rstrip("/"), headers={"X-API-Key": api_key},
                                 timeout=httpx.Timeout(timeout_s, connect=10.0),
                                 follow_redirects=True, verify=client_ssl_context()) as client:
        try:
            infos = []
            for _ in range(2):
                resp = await client.get("/task_info", params={"seed": seed})
                resp.raise_for_status()
                infos.append(resp.json())
            result.task_info_difference = first_difference(infos[0], infos[1])
            answers = []
            for attempt in range(2):
                body = body_for(f"{time.time_ns():x}-{attempt}")
                resp = await admitted(lambda body=body: client.post("/rollout", json=body),
                                      AdmissionWaits())
                answer = resp.json() if resp.status_code == 200 else None
                if (status := answered_status(resp.status_code, answer)) != 200:
                    result.error = f"rollout of seed {seed} answered HTTP {status}: " \
                                   f"{redact(resp.text.strip()[:200], hidden)}"
                    return result
                answers.append(answer)
        except (httpx.HTTPError, ValueError) as exc:
            result.error = redact(transport_error(exc) if isinstance(exc, httpx.HTTPError)
                                  else f"{type(exc).__name__}: {exc}", hidden)
            return result
    result.rewards = (_reward(answers[0]), _reward(answers[1]))
    details = (answers[0].get("metrics") or {}).get("details")
    if isinstance(details, dict) and isinstance(details.get("seed_ignored"), str):
        result.seed_ignored = details["seed_ignored"]
    result.rollout_difference = first_difference(_comparable(answers[0]),
                                                 _comparable(answers[1]))
    return result


__all__ = ["DeterminismResult", "VOLATILE_KEYS", "check_determinism", "first_difference"]
