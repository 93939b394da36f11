"""What a served task app can do, said in synth-containers' capability vocabulary, and the
contract's consumers judged against it (``GET /compatibility``).

Every claim is true of the kit, for any app it serves:

- it runs rollouts, blocking and async (``rollout_runnable``, ``async_rollout_runnable``),
  each starting its episode from a seed, stepping turn by turn and tracing each step's
  observation and reward (``resettable``, ``steppable``, ``observable``, ``reward_emitting``,
  ``trace_emitting``: derived, since the episode loop runs inside the rollout) and readable
  while it runs (``state_readable``: its state route);
- its policy calls go to the ``inference_url`` the caller gives (``proxied_inference``);
- with ``capture_tokens`` on, every policy call records its token ids and log-probabilities
  and the rollout's document carries them (``token_trace_emitting``, ``token_emission``);
- datasets it declares are served as a catalog (``catalog_backed``).

What it cannot do is declared false (pause, checkpoints, resume, fork, branching, a verifier,
a tool runtime) and its routes answer the contract's not-supported 404.
"""

from __future__ import annotations

from typing import Any

from synth_deploy.taskapp.config import TaskAppConfig

NATIVE, DERIVED, UNSUPPORTED = "native", "derived", "unsupported"
_RANK = {UNSUPPORTED: 0, "approximate": 1, DERIVED: 2, NATIVE: 3}

# The contract's execution profiles: the protocols each needs (synth-containers' profiles).
_EPISODE = ("resettable", "steppable", "observable", "state_readable")
PROFILES: dict[str, tuple[str, ...]] = {
    "stateless_evaluator": ("catalog_backed", "rollout_runnable", "verifier_backed"),
    "gym_style_environment": _EPISODE,
    "checkpointable_stateful_environment": (*_EPISODE, "checkpointable", "restorable"),
    "checkpointable_long_horizon_environment": (*_EPISODE, "checkpointable", "restorable",
                                                "async_rollout_runnable", "trace_emitting"),
    "multi_agent_long_horizon_environment": (*_EPISODE, "checkpointable", "restorable",
                                             "async_rollout_runnable", "trace_emitting",
                                             "multi_actor"),
    "sandboxed_mcp_world": ("async_rollout_runnable", "tool_callable", "trace_emitting"),
    "rl_trajectory_emitter": (*_EPISODE, "reward_emitting", "trace_emitting"),
    "token_level_rl_environment": (*_EPISODE, "reward_emitting", "trace_emitting",
                                   "token_trace_emitting", "proxied_inference_backed"),
    "harness_managed_benchmark_environment": ("catalog_backed", "async_rollout_runnable",
                                              "verifier_backed"),
}

# The contract's consumers and what each needs: profiles, protocols, one of each protocol
# group, and features (capability flags; ``async`` a rollout mode; ``stateful`` and
# ``long_horizon`` a statefulness tier at least that).
_RL = ("resettable", "steppable", "reward_emitting", "trace_emitting")
_TOKENS = (*_RL, "token_trace_emitting", "proxied_inference_backed")
_RL_FEATURES = ("trace_support", "reward_support")
_TOKEN_FEATURES = (*_RL_FEATURES, "token_ids", "proxied_inference")
TARGETS: dict[str, dict[str, tuple[Any, ...]]] = {
    "go_ex": {"profiles": ("checkpointable_long_horizon_environment",),
              "protocols": ("checkpointable", "restorable", "trace_emitting"),
              "groups": (("steppable", "rollout_runnable", "async_rollout_runnable"),
                         ("reward_emitting", "verifier_backed")),
              "features": ("long_horizon", "async", "checkpoint_support", "resume_support",
                           "supports_branching", "state_support", "trace_support")},
    "miprov2": {"groups": (("rollout_runnable", "async_rollout_runnable"),
                           ("reward_emitting", "verifier_backed"))},
    "standard_evals": {"profiles": ("harness_managed_benchmark_environment",),
                       "protocols": ("catalog_backed", "verifier_backed"),
                       "features": ("verifier_support",)},
    "pipeline_rl": {"profiles": ("rl_trajectory_emitter",), "protocols": _RL,
                    "features": _RL_FEATURES},
    "pipeline_rl_token_ids": {"profiles": ("token_level_rl_environment",),
                              "protocols": _TOKENS, "features": _TOKEN_FEATURES},
    "pipeline_rl_logprobs": {"profiles": ("token_level_rl_environment",),
                             "protocols": _TOKENS, "features": (*_TOKEN_FEATURES, "logprobs")},
    "pipeline_rl_logits": {"profiles": ("token_level_rl_environment",),
                           "protocols": _TOKENS, "features": (*_TOKEN_FEATURES, "logits")},
    "harbor_proxy": {"profiles": ("harness_managed_benchmark_environment",),
                     "protocols": ("catalog_backed", "async_rollout_runnable",
                                   "verifier_backed"),
                     "features": ("async", "verifier_support")},
    "openenv_proxy": {"profiles": ("gym_style_environment",), "protocols": _EPISODE,
                      "features": ("state_support",)},
    "archipelago_proxy": {"profiles": ("sandboxed_mcp_world",),
                          "protocols": ("async_rollout_runnable", "tool_callable",
                                        "trace_emitting"),
                          "features": ("async", "tool_runtime", "trace_support")},
}
_TIERS = ("stateless", "episodic", "stateful", "long_horizon")
_MINIMUM_TIER = {"go_ex": "long_horizon", "miprov2": "stateless", "standard_evals": "stateless",
                 "harbor_proxy": "stateless"}  # the others: episodic


def capabilities(config: TaskAppConfig, *, durable: bool, lease_ttl_s: float,
                 heartbeat_s: float) -> dict[str, Any]:
    """``/metadata``'s ``capabilities`` for ``config``'s app (see the module docstring)."""
    tokens = bool(config.capture_tokens)
    protocols = {
        "rollout_runnable": NATIVE, "async_rollout_runnable": NATIVE,
        "reward_emitting": NATIVE, "trace_emitting": NATIVE,
        "proxied_inference_backed": NATIVE,
        **dict.fromkeys(_EPISODE, DERIVED),
        **({"catalog_backed": DERIVED} if len(config.dataset_registry) else {}),
        **({"token_trace_emitting": NATIVE} if tokens else {}),
    }
    profiles = [name for name, needs in PROFILES.items()
                if all(_RANK[protocols.get(p, UNSUPPORTED)] >= _RANK[DERIVED] for p in needs)]
    one = "/rollouts/{rollout_id}"
    return {
        "runtime_kind": "environment", "profiles": profiles,
        "rollout_modes": ["blocking", "async"], "statefulness_tier": "episodic",
        "noun_fidelity": {}, "protocol_fidelity": protocols, "profile_fidelity": {},
        "checkpoint_semantics": "none", "restore_semantics": "",
        "resume_semantics": "unsupported",
        "checkpoint_support": False, "pause_support": False, "resume_support": False,
        "terminate_support": True, "state_support": True, "trace_support": True,
        "reward_support": True, "verifier_support": False, "artifact_support": True,
        "annotations_support": False,
        "tool_runtime": {"runtime_kind": "none", "schema_kind": "none", "output_mode": "none",
                         "supports_parallel_tool_calls": False,
                         "supports_streaming_events": False, "supports_mcp": False,
                         "supports_stateful_session": False,
                         "requires_stateful_session": False, "metadata": {}},
        "token_emission": {"token_ids": tokens, "tokens": False, "logprobs": tokens,
                           "logits": False, "top_logprobs": False, "old_logprobs": False,
                           "metadata": {}},
        "multi_actor": False, "proxied_inference": True, "supports_branching": False,
        "true_environment_snapshot": False,
        "route_hints": {
            "metadata_routes": ["/metadata", "/info"], "task_info_routes": ["/task_info"],
            "task_catalog_routes": ["/task_catalog"], "compatibility_routes": ["/compatibility"],
            "program_routes": ["/program"],
            "dataset_routes": ["/dataset", "/dataset/rows"],
            "taskset_routes": ["/taskset", "/taskset/tasks"],
            "rollout_routes": ["/rollouts", "/rollouts/prepare"],
            "state_routes": [one + "/state"], "pause_routes": [],
            "terminate_routes": [one + "/terminate"], "renew_routes": [one + "/renew"],
            "checkpoint_routes": [], "resume_routes": [],
            "summary_routes": [one + "/summary"], "usage_routes": [one + "/usage"],
            "event_routes": [one + "/events", one + "/stream"],
            "trace_routes": [one + "/trace"], "artifact_routes": [one + "/artifacts"],
            "reward_routes": [one + "/reward", "/reward"], "annotation_routes": []},
        "async_rollouts": {"durable": durable, "supports_idempotency": True,
                           "supports_lease_renewal": True, "supports_cancellation": True,
                           "lease_ttl_seconds": lease_ttl_s,
                           "sse_heartbeat_seconds": heartbeat_s},
        "metadata": {"policy_ready": True, "program_ready": False},
    }


def support(capabilities: dict[str, Any], target: str) -> dict[str, Any]:
    """How ``target`` (a key of `TARGETS`) judges ``capabilities``: the contract's
    compatibility report (``supported`` and what is missing); `KeyError` for another."""
    needs = TARGETS[target]
    protocols = capabilities.get("protocol_fidelity") or {}
    profiles = set(capabilities.get("profiles") or ())

    def has(protocol: str) -> bool:
        return _RANK.get(protocols.get(protocol, UNSUPPORTED), 0) >= _RANK[DERIVED]

    missing_profiles = [p for p in needs.get("profiles", ()) if p not in profiles]
    missing_protocols = [p for p in needs.get("protocols", ()) if not has(p)]
    missing_groups = ["|".join(g) for g in needs.get("groups", ()) if not any(map(has, g))]
    features = _missing_features(capabilities, target, needs.get("features", ()))
    issues = _issues(missing_profiles, missing_protocols, missing_groups, features)
    return {"target": target, "supported": not issues, "missing_profiles": missing_profiles,
            "missing_protocols": missing_protocols, "missing_protocol_groups": missing_groups,
            "missing_features": features, "issues": issues, "notes": []}


def _issues(profiles: list[str], protocols: list[str], groups: list[str],
            features: list[str]) -> list[dict[str, Any]]:
    """The report's issues, one for each thing missing, as the contract words them."""
    return ([{"code": "missing_profile", "message": f"missing profile: {p}",
              "fields": ["profile_fidelity", "profiles"]} for p in profiles]
            + [{"code": "missing_protocol", "message": f"missing protocol: {p}",
                "fields": ["protocol_fidelity"]} for p in protocols]
            + [{"code": "missing_protocol_group",
                "message": f"missing one of protocol group: {g}",
                "fields": ["protocol_fidelity"]} for g in groups]
            + [{"code": "missing_feature", "message": f"missing feature: {f}",
                "fields": ["capabilities"]} for f in features])


def _missing_features(capabilities: dict[str, Any], target: str, wanted: Any) -> list[str]:
    """The features ``target`` wants that ``capabilities`` lack, its minimum statefulness
    tier first."""
    tier = _MINIMUM_TIER.get(target, "episodic")
    features = [] if _TIERS.index(capabilities.get("statefulness_tier", "episodic")) >= \
        _TIERS.index(tier) else [f"minimum_statefulness:{tier}"]
    tokens = capabilities.get("token_emission") or {}
    tool_kind = (capabilities.get("tool_runtime") or {}).get("runtime_kind", "none")
    judged = {"async": "async" in (capabilities.get("rollout_modes") or ()),
              "tool_runtime": tool_kind != "none",
              "token_ids": tokens.get("token_ids"), "logprobs": tokens.get("logprobs"),
              "logits": tokens.get("logits")}
    for feature in wanted:
        if feature == "long_horizon":
            continue  # the tier, judged above
        if not judged.get(feature, capabilities.get(feature)):
            features.append("rollout_mode:async" if feature == "async" else feature)
    return features


def compatibility_matrix(capabilities: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {target: support(capabilities, target) for target in TARGETS}


__all__ = ["PROFILES", "TARGETS", "capabilities", "compatibility_matrix", "support"]
