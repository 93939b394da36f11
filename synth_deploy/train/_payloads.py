"""The bodies that create RL and SFT jobs: synth-ai 0.4.x's builders, field for field.

`rl_payload` is ``build_rl_payload`` (``sdk/api/train/builders.py``) after
``validate_rl_config``: the config as its schema dumps it (``[policy]`` sampling defaults,
``compute.topology.reference_placement`` and ``reference.placement`` "none" when unset, the
effective task URL), ``compute`` beside it, and the model as ``data.base_model`` or
``data.model``. `sft_payload` is ``build_sft_payload`` with ``prepare_sft_job_payload``:
only the hyperparameters and effective config fields synth-ai sends, in its order.

Deliberate differences (the README lists them): ``tags.source`` says ``synth-deploy``; the
model may also be named in ``[policy]`` (synth-ai's builder reads only ``[model]``);
``allow_experimental`` is sent when the flag is given; deprecated spellings are sent under
their new names (``[judge]`` as ``[verifier]``).
"""

from __future__ import annotations

from typing import Any

from synth_deploy.train._configs import TrainConfig

# What synth-ai's PolicyConfig fills in when a [policy] table leaves them out.
POLICY_DEFAULTS = {"max_tokens": 512, "temperature": 0.7, "top_p": 0.95,
                   "repetition_penalty": 1.0}
# The hyperparameters synth-ai's SFT builder copies, in the order its payload lists them.
SFT_HYPERPARAMETERS = ("batch_size", "global_batch", "per_device_batch",
                       "gradient_accumulation_steps", "sequence_length", "learning_rate",
                       "warmup_ratio", "train_kind")
SOURCE_TAG = {"source": "synth-deploy"}


def rl_payload(config: TrainConfig, task_url: str, *, model: str | None = None,
               backend: str | None = None) -> dict[str, Any]:
    """The RL job body for ``config`` against ``task_url``.

    ``model`` (``--model``) is sent as ``data.model``, as synth-ai does with its override;
    ``backend`` (``--backend``, an API base) as ``metadata.backend_base_url``.
    """
    cfg = config.backend_dict()
    compute = _fill_rl_defaults(cfg)
    cfg.setdefault("services", {})["task_url"] = task_url
    data: dict[str, Any] = {"endpoint_base_url": task_url.rstrip("/"), "config": cfg,
                            **_rl_model(config, model)}
    payload: dict[str, Any] = {"job_type": "rl", "compute": compute, "data": data,
                               "tags": dict(SOURCE_TAG)}
    if backend:
        payload["metadata"] = {"backend_base_url": backend.rstrip("/") + "/api"}
    return payload


def _fill_rl_defaults(cfg: dict[str, Any]) -> dict[str, Any]:
    """What synth-ai's schema fills in when the TOML leaves it out, in its order; the
    ``compute`` table, which the payload also carries beside the config."""
    policy = cfg.get("policy")
    if isinstance(policy, dict):
        for key, value in POLICY_DEFAULTS.items():
            policy.setdefault(key, value)
    rubric = _table(cfg, "verifier").get("rubric")
    if isinstance(rubric, dict):
        rubric.setdefault("enabled", False)
    # "Required for backend validators" (synth-ai): a reference placement, in both places.
    compute = cfg.setdefault("compute", {})
    compute.setdefault("topology", {}).setdefault("reference_placement", "none")
    reference = cfg.get("reference")
    if isinstance(reference, dict):
        reference.setdefault("placement", "none")
    else:
        cfg["reference"] = {"placement": "none"}
    return compute


def _rl_model(config: TrainConfig, model: str | None) -> dict[str, str]:
    """The model as synth-ai sends it: ``model`` for --model or a source checkpoint,
    ``base_model`` for a base; [policy] may name it when [model] does not (ours)."""
    if model:
        return {"model": model}
    section = config.model.model
    if section is None or not section.name:  # ours: [policy] may name it too
        section = config.model.policy_section
    if section is not None and section.source:
        return {"model": section.source}
    if section is not None and section.base_model:
        return {"base_model": section.base_model}
    return {}


def sft_payload(config: TrainConfig, *, model: str | None = None) -> dict[str, Any]:
    """The SFT job body for ``config``; ``training_file_id`` is filled in after upload."""
    cfg = config.backend_dict()
    hyper_cfg = _table(cfg, "hyperparameters")
    hyper: dict[str, Any] = {"n_epochs": int(hyper_cfg.get("n_epochs", 1)),
                             **{k: hyper_cfg[k] for k in SFT_HYPERPARAMETERS if k in hyper_cfg}}
    if isinstance(hyper_cfg.get("parallelism"), dict):
        hyper["parallelism"] = hyper_cfg["parallelism"]
    validation = _table(cfg, "training").get("validation")
    if isinstance(validation, dict):
        hyper.update(_validation_hyperparameters(validation))
    return {"model": (model or config.model.job.model).strip(),
            "hyperparameters": _normalised_hyperparameters(hyper),
            "training_type": "sft_offline",
            "metadata": {"effective_config": _effective_config(cfg)},
            "training_file_id": None}


def _effective_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config fields synth-ai's SFT builder reports in the job's metadata, no others."""
    compute = _table(cfg, "compute")
    training = _table(cfg, "training")
    topology = _table(cfg, "data").get("topology")
    effective: dict[str, Any] = {
        "compute": {k: compute[k] for k in ("gpu_type", "gpu_count", "nodes") if k in compute},
        "data": {"topology": topology if isinstance(topology, dict) else {}},
        "training": {k: v for k, v in training.items() if k in ("mode", "use_qlora")},
    }
    validation = training.get("validation")
    if isinstance(validation, dict):
        effective["training"]["validation"] = {"enabled": bool(validation.get("enabled", True))}
    return effective


def _validation_hyperparameters(validation: dict[str, Any]) -> dict[str, Any]:
    """[training.validation] as synth-ai's builder sends it, its defaults filled in."""
    return {
        "evaluation_strategy": validation.get("evaluation_strategy", "steps"),
        "eval_steps": int(validation.get("eval_steps", 0) or 0),
        "save_best_model_at_end": bool(validation.get("save_best_model_at_end", True)),
        "metric_for_best_model": validation.get("metric_for_best_model", "val.loss"),
        "greater_is_better": bool(validation.get("greater_is_better", False)),
    }


def add_validation_file(payload: dict[str, Any], file_id: str) -> None:
    """Where synth-ai puts an uploaded validation file: the effective config's data."""
    payload.setdefault("metadata", {}).setdefault("effective_config", {}).setdefault(
        "data", {})["validation_files"] = [file_id]


def _normalised_hyperparameters(hyper: dict[str, Any]) -> dict[str, Any]:
    # prepare_sft_job_payload: known keys first (ints and floats as such), the rest after.
    ints = ("n_epochs", "batch_size", "global_batch", "per_device_batch",
            "gradient_accumulation_steps", "sequence_length")
    out: dict[str, Any] = {}
    for key in (*ints, "learning_rate", "warmup_ratio", "train_kind"):
        if hyper.get(key) is not None:
            value = hyper[key]
            out[key] = int(value) if key in ints else float(value) if key in (
                "learning_rate", "warmup_ratio") else value
    out.update({k: v for k, v in hyper.items() if k not in out})
    return out


def _table(data: dict[str, Any], name: str) -> dict[str, Any]:
    value = data.get(name)
    return value if isinstance(value, dict) else {}


__all__ = ["POLICY_DEFAULTS", "add_validation_file", "rl_payload", "sft_payload"]
