"""Configs, job payloads and SFT data as synth-ai 0.4.4 has them (issue 11, items 7-9).

``configs/synth_ai/*.toml``: the three example configs shipped in synth-ai's wheel (copied
unchanged) and two in its current schema. ``*.payload.json``: what synth-ai's own
``build_rl_payload`` / ``build_sft_payload`` made of those TOMLs (regenerate with
bench/_synth_ai_side.py); our builders must give the same bodies, field for field.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from synth_ai_rules import rl_config_problems, sft_config_problems, sft_example_problem
from train_cli import APP_CONFIGS, FAST, RL_HEAD, env_file, run, sft_workspace, write

from synth_deploy.errors import UsageError
from synth_deploy.tracing import flat_tools
from synth_deploy.train import (
    POLICY_DEFAULTS,
    load_config,
    rl_payload,
    sft_payload,
    upload_copy,
    validate_sft_example,
)

SAI = Path(__file__).parent / "configs" / "synth_ai"
TASK_URL = "https://app.example"
NESTED = [{"type": "function", "function": {
    "name": "add", "description": "Add two numbers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}]
EXAMPLE = {"messages": [{"role": "user", "content": "2 + 2?"},
                        {"role": "assistant", "content": None, "tool_calls": [
                            {"id": "c1", "type": "function",
                             "function": {"name": "add", "arguments": "{\"a\": 2}"}}]}]}


def synth_ai_payload(name: str) -> dict:
    payload = json.loads((SAI / f"{name}.payload.json").read_text())
    if "tags" in payload:  # RL jobs: the one deliberate difference
        assert payload["tags"] == {"source": "train-cli"}
        payload["tags"] = {"source": "synth-deploy"}
    return payload


# -- schemas, both ways (item 7) ------------------------------------------------------------


def test_the_example_configs_shipped_in_synth_ais_wheel_load():
    math = load_config(SAI / "math_rl.toml")
    assert math.kind == "rl" and math.model.policy.model == "Qwen/Qwen3-1.7B"
    assert math.model.policy_section.name == "Qwen/Qwen3-1.7B"
    assert math.model.data.episodes_per_iteration == 1280
    assert math.model.training.reward_negative_no_tool == -1.0
    assert any("[policy].model is not synth-ai's spelling" in w for w in math.warnings)
    crafter = load_config(SAI / "crafter_rl.toml")
    assert crafter.model.training.step_rewards_mode == "decision_stepwise"
    assert crafter.model.training.weight_sync.weight_sync_interval == 1
    assert any("step_rewards_enabled" in w and "[training.rewards]" in w
               for w in crafter.warnings)
    fft = load_config(SAI / "crafter_fft.toml")
    assert fft.kind == "sft" and fft.model.training.mode == "sft_offline"
    assert fft.model.algorithm.method == "supervised_finetune"


def test_what_synth_ais_train_refuses_for_want_of_a_section_is_said(tmp_path):
    # synth-ai 0.4.4's own docstring example has no [compute] and it refuses it; the kit
    # loads it (the backend may fill it in) and says so.
    said = load_config(write(tmp_path, RL_HEAD + "[compute]\ngpu_type = \"H100\"\n"
                             "gpu_count = 0\n")).warnings
    assert any("without variety" in w for w in said), said
    assert any("without [compute] gpu_count (a gpu_count of 0 counts as missing)" in w
               for w in said), said
    assert any("without [compute.topology]" in w for w in said), said
    math = load_config(Path(__file__).resolve().parents[2] / "apps" / "math" / "configs"
                       / "rl.toml")
    assert not [w for w in math.warnings if "refuses" in w], math.warnings


def test_synth_ais_policy_spelling_loads_and_typos_still_get_a_did_you_mean(tmp_path):
    cfg = load_config(write(tmp_path, RL_HEAD + '[policy]\nmodel_name = "Qwen/Qwen3-4B"\n'
                            'trainer_mode = "lora"\nlabel = "x"\ntemperature = 0.5\n'))
    assert cfg.model.policy_section.base_model == "Qwen/Qwen3-4B"
    assert not [w for w in cfg.warnings if "[policy]" in w or "model section" in w], \
        cfg.warnings
    path = write(tmp_path, RL_HEAD + '[policy]\nmodel_nme = "x"\n[training]\n'
                 'step_reward_mode = "off"\n[data]\nsplt = "train"\n', "typo.toml")
    with pytest.raises(UsageError) as info:
        load_config(path)
    msg = info.value.message
    assert "policy.model_nme: unknown key (did you mean policy.model_name?)" in msg
    assert "training.step_reward_mode: unknown key (did you mean " \
           "training.step_rewards_mode?)" in msg
    assert "data.splt: unknown key (did you mean data.split?)" in msg


def test_one_model_per_section_and_bounds_say_what_came(tmp_path):
    path = write(tmp_path, RL_HEAD + '[policy]\nmodel_name = "a"\nsource = "ft:b"\n')
    with pytest.raises(UsageError, match="set one model: either source or base/model_name"):
        load_config(path)
    path = write(tmp_path, '[algorithm]\ntype = "offline"\nmethod = "sft"\n[job]\nmodel = "m"\n'
                 '[hyperparameters]\nn_epochs = 0\nwarmup_ratio = 1.5\n', "sft.toml")
    with pytest.raises(UsageError) as info:
        load_config(path)
    assert "hyperparameters.n_epochs: must be at least 1, got 0" in info.value.message
    assert "hyperparameters.warmup_ratio: must be at most 1, got 1.5" in info.value.message


def test_our_example_configs_are_valid_under_synth_ais_schema():
    rl = load_config(APP_CONFIGS / "rl.toml")
    sft = load_config(APP_CONFIGS / "sft.toml")
    assert rl.warnings == [] and sft.warnings == []
    assert rl_config_problems(tomllib.loads((APP_CONFIGS / "rl.toml").read_text())) == []
    assert sft_config_problems(tomllib.loads((APP_CONFIGS / "sft.toml").read_text())) == []


def test_what_synth_ais_train_command_refuses_is_named(tmp_path):
    cfg = load_config(write(tmp_path, RL_HEAD + '[verifier]\nenabled = true\ntimeout_s = 5\n'))
    assert any("refuses a [verifier] without [verifier.options]" in w for w in cfg.warnings)
    assert any("refuses verifier.timeout_s (use verifier.options.timeout_s)" in w
               for w in cfg.warnings)


# -- payloads, field for field (item 8) ------------------------------------------------------


@pytest.mark.parametrize("toml, golden", [
    (SAI / "policy_rl.toml", "policy_rl"),
    (APP_CONFIGS / "rl.toml", "math_example_rl"),
])
def test_rl_payload_is_synth_ais_build_rl_payload(toml, golden):
    assert rl_payload(load_config(toml), TASK_URL) == synth_ai_payload(golden)


def test_sft_payload_is_synth_ais_build_sft_payload():
    assert sft_payload(load_config(SAI / "sft_fft.toml")) == synth_ai_payload("sft_fft")
    assert any("weight_decay is not sent" in w for w in load_config(SAI / "sft_fft.toml")
               .warnings)


def test_rl_payload_fills_the_reference_placement_the_backend_validators_need(tmp_path):
    cfg = load_config(write(tmp_path, RL_HEAD + '[compute]\ngpu_type = "H100"\n'
                            'gpu_count = 1\n[model]\nsource = "ft:abc"\n'))
    payload = rl_payload(cfg, TASK_URL)
    assert payload["data"]["config"]["reference"] == {"placement": "none"}
    assert payload["compute"]["topology"] == {"reference_placement": "none"}
    assert payload["data"]["config"]["compute"] == payload["compute"]
    assert payload["data"]["model"] == "ft:abc" and "base_model" not in payload["data"]


def test_model_and_backend_overrides_land_where_synth_ai_puts_them(tmp_path):
    cfg = load_config(SAI / "policy_rl.toml")
    payload = rl_payload(cfg, TASK_URL, model="Qwen/Qwen3-8B", backend="https://b.example")
    assert payload["data"]["model"] == "Qwen/Qwen3-8B" and "base_model" not in payload["data"]
    assert payload["data"]["config"]["model"]["base"] == "Qwen/Qwen3-1.7B"  # sent as written
    assert payload["metadata"] == {"backend_base_url": "https://b.example/api"}


def test_a_policy_only_config_names_its_model_with_synth_ais_sampling_defaults(tmp_path):
    cfg = load_config(write(tmp_path, RL_HEAD + '[policy]\nmodel_name = "Qwen/Qwen3-4B"\n'))
    payload = rl_payload(cfg, TASK_URL)
    assert payload["data"]["base_model"] == "Qwen/Qwen3-4B"  # ours: synth-ai needs [model]
    assert payload["data"]["config"]["policy"] == {"model_name": "Qwen/Qwen3-4B",
                                                   **POLICY_DEFAULTS}


def test_an_sft_validation_file_goes_where_synth_ai_puts_it(work, backend, synth_key):  # noqa: F811
    config = sft_workspace(work)
    (work / "val.jsonl").write_text((work / "sft_examples.jsonl").read_text())
    config.write_text(config.read_text() + '\n[data]\nvalidation_path = "val.jsonl"\n')
    env = env_file(work, SYNTH_API_KEY=synth_key, SYNTH_BACKEND_URL=backend.url)
    result = run("--config", str(config), "--env-file", env, *FAST, "--no-poll")
    assert result.exit_code == 0, result.output
    (job,) = backend.jobs.values()
    train_id, val_id = list(backend.files)
    assert job.payload["training_file_id"] == train_id
    assert job.payload["metadata"]["effective_config"]["data"] == {
        "topology": {}, "validation_files": [val_id]}
    assert "validation_file_id" not in job.payload


# -- SFT tools (item 9) -------------------------------------------------------------------------


def test_tools_are_checked_by_synth_ais_rules_in_either_form():
    assert validate_sft_example({**EXAMPLE, "tools": NESTED}) == []
    assert validate_sft_example({**EXAMPLE, "tools": flat_tools(NESTED)}) == []
    flat_call = {"role": "assistant", "tool_calls": [{"name": "add", "arguments": "{}"}]}
    assert validate_sft_example({"messages": [EXAMPLE["messages"][0], flat_call]}) == []
    problems = validate_sft_example({**EXAMPLE, "tools": [
        {"type": "function", "function": {"description": "no name"}},
        {"name": "", "parameters": "not a schema"}, "add"]})
    assert problems[0].startswith("tools[0].function.name: required (a tool is")
    assert "tools[1].name: required" in problems[1]
    assert problems[2] == "tools[1].parameters: expected an object (a JSON schema), got string"
    assert problems[3].startswith("tools[2]: expected an object")


def test_nested_tools_are_flattened_into_the_form_synth_ai_reads():
    flat = flat_tools(NESTED)
    assert flat == [{"type": "function", **NESTED[0]["function"]}]
    assert sft_example_problem({**EXAMPLE, "tools": NESTED}) == "tool 0 missing name"
    assert sft_example_problem({**EXAMPLE, "tools": flat}) is None
    assert flat_tools(flat) == flat and flat_tools(None) is None


def test_an_upload_carries_flat_tools_and_the_file_stays_as_written(
        work, backend, synth_key):  # noqa: F811
    config = sft_workspace(work, lines=0)
    data = work / "sft_examples.jsonl"
    data.write_text("".join(json.dumps({**EXAMPLE, "tools": NESTED,
                                        "metadata": {"i": i}}) + "\n" for i in range(3)))
    before = data.read_bytes()
    env = env_file(work, SYNTH_API_KEY=synth_key, SYNTH_BACKEND_URL=backend.url)
    result = run("--config", str(config), "--env-file", env, *FAST, "--no-poll")
    assert result.exit_code == 0, result.output
    (upload,) = backend.files.values()
    sent = [json.loads(line) for line in upload["content"].decode().splitlines()]
    assert [s["metadata"]["i"] for s in sent] == [0, 1, 2]
    assert all(sft_example_problem(s) is None for s in sent)
    assert data.read_bytes() == before
    assert sorted(p.name for p in work.iterdir()) == ["sft.toml", "sft_examples.jsonl",
                                                      "test.env"]
    plain = work / "plain.jsonl"
    plain.write_text(json.dumps({**EXAMPLE, "tools": flat_tools(NESTED)}) + "\n")
    assert upload_copy(plain) is None  # already flat: the file itself is uploaded
