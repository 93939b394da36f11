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
# What synth-ai 0.4.4's `train` requires of an RL config's sections (validate_rl_config):
# [rollout] always, [training] and [evaluation] when present, the model's naming keys.
_REQUIRED_RL = {
    "rollout": ("env_name", "policy_name"),
    "training": ("num_epochs", "iterations_per_epoch", "max_turns", "batch_size",
                 "group_size", "learning_rate"),
    "evaluation": ("instances", "every_n_iters", "seeds"),
}
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
    notes = _train_refusals(data, kind) + _policy_notes(_table(data, "policy"))
    if kind == "sft":
        if "weight_decay" in _table(data, "hyperparameters"):
            notes.append("hyperparameters.weight_decay is not sent: synth-ai's SFT job has no "
                         "weight decay field (the backend uses its own)")
        return notes
    notes += _rl_refusals(data)
    training = _table(data, "training")
    flat = [f"training.{key}" for key in _FLAT_REWARDS if key in training]
    if flat:
        notes.append(f"{', '.join(flat)}: deprecated, set in [training.rewards] instead")
    notes += _verifier_notes(_table(data, "verifier"))
    for (section, key), advice in _REFUSED.items():
        if key in _table(data, *section.split(".")):
            notes.append(f"synth-ai 0.4.4's `train` refuses {section}.{key} ({advice})")
    return notes


def _rl_refusals(data: dict[str, Any]) -> list[str]:
    """What synth-ai 0.4.4's `train` refuses of an RL config's sections."""
    notes: list[str] = []
    compute = _table(data, "compute")
    if compute and not (compute.get("topology") or _table(data, "topology")):
        notes.append("synth-ai 0.4.4's `train` refuses an RL config without [compute.topology] "
                     "(gpus_for_vllm, gpus_for_training...)")
    for section, keys in _REQUIRED_RL.items():
        notes += _missing_keys(section, _table(data, section), keys)
    return notes + _model_refusals(_table(data, "policy") or _table(data, "model"))


def _missing_keys(section: str, table: dict[str, Any], keys: Any) -> list[str]:
    """The keys of [section] synth-ai 0.4.4's `train` requires that ``table`` lacks (a 0 is
    given); [rollout] is required, the others only when present."""
    missing = [k for k in keys if not table.get(k) and table.get(k) != 0]
    if (table or section == "rollout") and missing:
        return [f"synth-ai 0.4.4's `train` refuses [{section}] without {', '.join(missing)}"]
    return []


def _model_refusals(named: dict[str, Any]) -> list[str]:
    """What synth-ai 0.4.4's `train` refuses of an RL config's model section."""
    missing = [k for k in ("trainer_mode", "label") if not named.get(k)] if named else []
    return [f"synth-ai 0.4.4's `train` refuses a model section without "
            f"{' and '.join(missing)}"] if missing else []


def _train_refusals(data: dict[str, Any], kind: str) -> list[str]:
    """What synth-ai 0.4.4's `train` refuses that the kit builds: said, not refused."""
    notes: list[str] = []
    algorithm = _table(data, "algorithm")
    if algorithm and not algorithm.get("variety"):
        notes.append("synth-ai 0.4.4's `train` refuses an [algorithm] without variety "
                     f"(e.g. {'gspo' if kind == 'rl' else 'fft or lora'})")
    compute = _table(data, "compute")
    missing = [k for k in ("gpu_type", "gpu_count") if not compute.get(k)]  # 0 is missing
    if missing:
        notes.append(f"synth-ai 0.4.4's `train` refuses a config without [compute] "
                     f"{' and '.join(missing)} (a gpu_count of 0 counts as missing)")
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
