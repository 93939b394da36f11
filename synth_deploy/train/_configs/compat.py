"""Warnings for configs that load here but that synth-ai 0.4.x would read differently.

Deprecated spellings its schema still declares, spellings it does not know, and the fields
its `train` command refuses (``cli/commands/train/validation.py`` and
``verifier_validation.py``). None of them stops a job: each is one line saying what to write
instead, so one config file works with both tools.
"""

from __future__ import annotations

from typing import Any

_FLAT_REWARDS = ("step_rewards_enabled", "step_rewards_mode", "step_rewards_indicator_lambda",
                 "step_rewards_beta", "step_rewards_strategy", "event_rewards_kind")
# (section path, key) -> what synth-ai's `train` says instead.
_REFUSED = {
    ("verifier", "type"): "drop it",
    ("verifier", "timeout_s"): "use verifier.options.timeout_s",
    ("verifier.options", "max_concurrency"): "drop it",
    ("verifier.options", "tracks"): "drop it",
    ("rubric", "model"): "use verifier.options.model",
    ("rubric", "api_base"): "drop it",
    ("rubric", "api_key_env"): "drop it",
    ("rubric", "event"): "use verifier.options.rubric_overrides",
    ("rubric", "outcome"): "use verifier.options.rubric_overrides",
}


def compat_warnings(data: dict[str, Any], kind: str) -> list[str]:
    """One line for each way ``data`` (the TOML, renamed spellings already moved) departs
    from what synth-ai 0.4.x reads."""
    notes = _policy_notes(_table(data, "policy"))
    if kind == "sft":
        if "weight_decay" in _table(data, "hyperparameters"):
            notes.append("hyperparameters.weight_decay is not sent: synth-ai's SFT job has no "
                         "weight decay field (the backend uses its own)")
        return notes
    training = _table(data, "training")
    flat = [f"training.{key}" for key in _FLAT_REWARDS if key in training]
    if flat:
        notes.append(f"{', '.join(flat)}: deprecated, set in [training.rewards] instead")
    notes += _verifier_notes(_table(data, "verifier"))
    for (section, key), advice in _REFUSED.items():
        if key in _table(data, *section.split(".")):
            notes.append(f"synth-ai 0.4.4's `train` refuses {section}.{key} ({advice})")
    return notes


def _policy_notes(policy: dict[str, Any]) -> list[str]:
    """The model named by a spelling only this kit reads, when synth-ai's is absent."""
    if not policy or policy.get("model_name") or policy.get("source"):
        return []
    return [f"[policy].{key} is not synth-ai's spelling (read here as the model); synth-ai "
            "reads [policy].model_name, or [model].base"
            for key in ("base", "model") if policy.get(key)]


def _verifier_notes(verifier: dict[str, Any]) -> list[str]:
    """A [verifier] in the deprecated shape, or one synth-ai's `train` would refuse."""
    notes = []
    if "rubric" in verifier:
        notes.append("verifier.rubric is deprecated: use verifier.enabled and "
                     "verifier.reward_blend")
    if verifier and not verifier.get("options"):
        notes.append("synth-ai 0.4.4's `train` refuses a [verifier] without [verifier.options] "
                     "(provider and model)")
    return notes


def _table(data: dict[str, Any], *path: str) -> dict[str, Any]:
    for part in path:
        data = data.get(part) if isinstance(data, dict) else None
    return data if isinstance(data, dict) else {}


__all__ = ["compat_warnings"]
