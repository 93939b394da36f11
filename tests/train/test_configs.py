"""RL/SFT TOML configs: every section, unknown keys, deprecated spellings, bad types."""

from __future__ import annotations

from pathlib import Path

import pytest
from train_cli import APP_CONFIGS, RL_HEAD, write

from synth_deploy.errors import UsageError
from synth_deploy.train import RLConfig, SFTConfig, discover_configs, load_config

FIXTURES = Path(__file__).parent / "configs"
SFT_HEAD = '[algorithm]\ntype = "offline"\nmethod = "sft"\n[job]\nmodel = "m"\n'


def test_rl_config_with_every_section_loads_field_by_field():
    cfg = load_config(FIXTURES / "rl_full.toml")
    assert cfg.kind == "rl" and isinstance(cfg.model, RLConfig)
    # Every field loads; the four synth-ai's `train` command refuses are named, nothing else.
    assert [w.split("refuses ")[1].split(" ")[0] for w in cfg.warnings] == [
        "verifier.type", "verifier.timeout_s", "verifier.options.max_concurrency",
        "verifier.options.tracks"]
    m = cfg.model
    assert m.services.verifier_url == "https://verifier.example/api"
    assert m.compute.topology == {"gpus_for_vllm": 2, "gpus_for_training": 2}
    assert m.policy_section.base == "Qwen/Qwen3-4B" and m.model.trainer_mode == "lora"
    assert m.rollout.policy_config == {"temperature": 0.7} and m.rollout.batches_per_step == 2
    assert m.training.weight_sync.verify_every_k == 5
    assert m.training.lora.target_modules == ["q_proj", "v_proj"]
    assert m.training.rewards.step_rewards_mode == "decision_stepwise"
    assert m.training.rewards.event_rewards_kind == "unique"
    assert m.evaluation.seeds == [0, 1, 2]
    assert m.verifier.reward_blend.event == 0.25 and m.verifier.options.max_concurrency == 4
    assert m.smoke.task_app_port == 8765 and m.smoke.sqld_http_port == 8081
    assert m.tags == {"team": "rl"}
    sent = cfg.backend_dict()
    assert "smoke" not in sent and "smoke" in cfg.raw  # CLI-only, never sent


def test_sft_config_with_every_section_resolves_paths_against_its_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # paths must not depend on the working directory
    cfg = load_config(FIXTURES / "sft_full.toml")
    assert cfg.kind == "sft" and isinstance(cfg.model, SFTConfig)
    assert cfg.dataset_path == (FIXTURES / "data" / "train.jsonl").resolve()
    assert cfg.validation_path == (FIXTURES / "data" / "val.jsonl").resolve()
    m = cfg.model
    assert m.hyperparameters.n_epochs == 2 and m.hyperparameters.sequence_length == 1024
    assert m.hyperparameters.parallelism.deepspeed_stage == 2
    assert m.training.validation.evaluation_strategy == "steps"
    assert m.training.lora.r == 8 and m.policy.label == "full-sft"
    assert m.data.topology == {"container_count": 1}


def test_sft_defaults():
    cfg = SFTConfig.model_validate({"job": {"model": "m"}})
    # synth-ai's defaults: one epoch; the sequence length is the backend's unless given.
    assert cfg.hyperparameters.n_epochs == 1 and cfg.hyperparameters.sequence_length is None


def test_example_app_configs_validate():
    assert load_config(APP_CONFIGS / "rl.toml").kind == "rl"
    sft = load_config(APP_CONFIGS / "sft.toml")
    assert sft.kind == "sft" and sft.dataset_path.is_file()


def test_unknown_keys_name_their_path_and_suggest_the_field(tmp_path):
    path = write(tmp_path, RL_HEAD + '[servces]\ntask_url = "x"\n[training]\nlerning_rate = 1.0\n'
                 '[training.lora]\nrank = 4\n[verifier.options]\nprovder = "synth"\n')
    with pytest.raises(UsageError) as info:
        load_config(path)
    msg = info.value.message
    assert "c.toml: servces: unknown key (did you mean services?)" in msg
    assert "training.lerning_rate: unknown key (did you mean training.learning_rate?)" in msg
    assert "training.lora.rank: unknown key" in msg
    assert "verifier.options.provder: unknown key (did you mean verifier.options.provider?)" \
        in msg
    assert "4 problem(s)" in msg


def test_bad_types_say_what_was_expected_and_what_came(tmp_path):
    path = write(tmp_path, RL_HEAD + '[training]\nbatch_size = "ten"\nlearning_rate = "fast"\n'
                 '[rollout]\nenv_config = 3\n[evaluation]\nseeds = "0-9"\n'
                 '[training.rewards]\nstep_rewards_mode = "dense"\n'
                 '[model]\ntrainer_mode = "half"\n')
    with pytest.raises(UsageError) as info:
        load_config(path)
    msg = info.value.message
    assert "training.batch_size: expected an integer, got 'ten'" in msg
    assert "training.learning_rate: expected a number, got 'fast'" in msg
    assert "rollout.env_config: expected a table, got 3" in msg
    assert "evaluation.seeds: expected an array, got '0-9'" in msg
    assert "training.rewards.step_rewards_mode: expected one of" in msg and "'dense'" in msg
    assert "model.trainer_mode: expected one of" in msg


def test_sft_missing_required_and_bad_hyperparameters(tmp_path):
    path = write(tmp_path, '[algorithm]\ntype = "offline"\nmethod = "sft"\n'
                 '[hyperparameters]\nn_epochs = 1.5\n[hyperparameters.parallelism]\nbf16 = "yes"\n')
    with pytest.raises(UsageError) as info:
        load_config(path)
    msg = info.value.message
    assert "job: required" in msg
    assert "hyperparameters.n_epochs: expected an integer, got 1.5" in msg
    assert "hyperparameters.parallelism.bf16: expected true or false, got 'yes'" in msg


def test_source_and_base_together_is_an_error(tmp_path):
    path = write(tmp_path, RL_HEAD + '[model]\nsource = "ft:x"\nbase = "y"\n')
    with pytest.raises(UsageError, match="either source or base"):
        load_config(path)


def test_deprecated_spellings_load_with_a_warning_each():
    cfg = load_config(FIXTURES / "rl_deprecated.toml")
    text = "\n".join(cfg.warnings)
    for old in ("[judge]", "judge_url", "[lora]", "[topology]", "[reference]", "[rubric]"):
        assert old in text, old
    assert cfg.model.verifier.timeout_s == 10  # [judge] read as [verifier]
    assert cfg.model.services.verifier_url == "https://judge.example"
    assert "judge" not in cfg.backend_dict() and cfg.backend_dict()["verifier"]["enabled"]
    assert cfg.model.policy_section.base == "Qwen/Qwen3-0.6B"


def test_judge_and_verifier_together_is_an_error(tmp_path):
    path = write(tmp_path, RL_HEAD + "[judge]\nenabled = true\n[verifier]\nenabled = true\n")
    with pytest.raises(UsageError, match=r"both \[judge\] and \[verifier\]"):
        load_config(path)


def test_model_and_policy_must_agree(tmp_path):
    path = write(tmp_path, RL_HEAD + '[model]\nbase = "a"\n[policy]\nmodel_name = "b"\n')
    with pytest.raises(UsageError, match=r"\[model\] and \[policy\] name different models"):
        load_config(path)


def test_toml_syntax_error_points_at_the_line(tmp_path):
    path = write(tmp_path, RL_HEAD + "[training]\nbatch_size = \n")
    with pytest.raises(UsageError, match=rf"{path}:5: TOML syntax error"):
        load_config(path)


def test_type_is_inferred_or_forced(tmp_path):
    assert load_config(write(tmp_path, SFT_HEAD)).kind == "sft"
    no_algo = write(tmp_path, '[job]\nmodel = "m"\n', "noalgo.toml")
    assert load_config(no_algo).kind == "sft"
    assert load_config(no_algo, "sft").kind == "sft"
    with pytest.raises(UsageError, match="--type rl given, but the config is an sft config"):
        load_config(no_algo, "rl")
    unclear = write(tmp_path, '[tags]\na = "b"\n', "unclear.toml")
    with pytest.raises(UsageError, match="cannot tell whether"):
        load_config(unclear)
    assert load_config(write(tmp_path, "[services]\ntask_url = 'u'\n[algorithm]\n"
                             "type = 'online'\nmethod = 'policy_gradient'\n", "rl.toml"),
                       "rl").kind == "rl"
    with pytest.raises(UsageError, match="--type must be one of"):
        load_config(no_algo, "ppo")


def test_missing_file(tmp_path):
    with pytest.raises(UsageError, match="config not found"):
        load_config(tmp_path / "nope.toml")


def test_discovery_finds_configs_and_skips_noise(tmp_path):
    write(tmp_path, RL_HEAD, "rl.toml")
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub", SFT_HEAD, "sft.toml")
    write(tmp_path, '[project]\nname = "x"\n', "pyproject.toml")
    write(tmp_path, '[tool]\nx = 1\n', "other.toml")
    write(tmp_path, "not = = toml", "broken.toml")
    for skipped in (".git", ".venv", "node_modules"):
        (tmp_path / skipped).mkdir()
        write(tmp_path / skipped, RL_HEAD, "hidden.toml")
    found = [p.relative_to(tmp_path).as_posix() for p in discover_configs(tmp_path)]
    assert found == ["rl.toml", "sub/sft.toml"]


def test_discovery_is_bounded_in_depth_and_folders(tmp_path):
    deep = tmp_path
    for name in "abcde":
        deep = deep / name
        deep.mkdir()
        write(deep, RL_HEAD, "rl.toml")
    (tmp_path / ".config").mkdir()
    write(tmp_path / ".config", RL_HEAD, "rl.toml")
    found = [p.relative_to(tmp_path).as_posix() for p in discover_configs(tmp_path)]
    assert found == ["a/rl.toml", "a/b/rl.toml", "a/b/c/rl.toml", "a/b/c/d/rl.toml"]
    wide = tmp_path / "wide"
    for i in range(30):
        (wide / f"d{i:02d}").mkdir(parents=True)
    write(wide / "d29", RL_HEAD, "rl.toml")
    assert discover_configs(wide) == [wide / "d29" / "rl.toml"]
    assert discover_configs(wide, max_dirs=10) == []  # stops after ten folders


@pytest.mark.parametrize("section, line, said", [
    ("training", "batch_size = -16", "training.batch_size: expected at least 1 (a count), "
     "got -16"),
    ("rollout", "max_concurrent_rollouts = -8",
     "rollout.max_concurrent_rollouts: expected at least 1 (a count), got -8"),
    ("compute", "gpu_count = 9223372036854775807",
     "compute.gpu_count: expected at most 2147483647 (a count), got 9223372036854775807"),
    ("training", "learning_rate = 0.0", "training.learning_rate: expected greater than 0"),
    ("evaluation", "seeds = [1, -2]", "evaluation.seeds.1: expected at least 0"),
    ("policy", "top_p = 1.5", "policy.top_p: expected at most 1 (a probability)"),
    ("training.weight_sync", "verify_every_k = -1",
     "training.weight_sync.verify_every_k: expected at least 0"),
])
def test_rl_values_out_of_range_load_as_synth_ai_loads_them_and_are_named(tmp_path, section,
                                                                         line, said):
    # synth-ai 0.4.4's schema sets no range on them: it builds them into the payload as
    # written, and so do we, saying which key is off.
    path = write(tmp_path, RL_HEAD + f"[{section}]\n{line}\n")
    warned = [w for w in load_config(path).warnings if said in w]
    assert len(warned) == 1, load_config(path).warnings
    assert "the backend decides" in warned[0]


@pytest.mark.parametrize("section, line", [
    ("training.weight_sync", "verify_every_k = 0"),  # 0: never; synth-ai sends it
    ("policy", "top_k = -1"),  # vLLM's "off"
    ("evaluation", "seeds = [0, 1]"),
])
def test_rl_values_a_trainer_takes_load_without_a_word(tmp_path, section, line):
    warnings = load_config(write(tmp_path, RL_HEAD + f"[{section}]\n{line}\n")).warnings
    assert not [w for w in warnings if "expected" in w], warnings


@pytest.mark.parametrize("section, line, said", [
    ("training", "learning_rate = inf", "training.learning_rate: expected a finite number, "
     "got inf"),
    ("training", "reward_positive = nan", "training.reward_positive: expected a finite number"),
    ("rollout", "env_config = { limit = -inf }", "rollout.env_config.limit: expected a finite"),
])
def test_rl_values_json_cannot_carry_are_refused_naming_their_key(tmp_path, section, line,
                                                                 said):
    path = write(tmp_path, RL_HEAD + f"[{section}]\n{line}\n")
    with pytest.raises(UsageError) as info:
        load_config(path)
    assert said in info.value.message, info.value.message


@pytest.mark.parametrize("levels", [20, 5_000])
def test_a_deeply_nested_array_is_a_usage_error(tmp_path, levels):
    path = write(tmp_path, RL_HEAD + "[rollout]\nenv_config = { a = " + "[" * levels
                 + "]" * levels + " }\n")
    with pytest.raises(UsageError) as info:
        load_config(path)
    assert "nested" in info.value.message and str(path) in info.value.message


def test_a_verifier_timeout_synth_ai_refuses_is_refused_here_too(tmp_path):
    # synth-ai 0.4.4's verifier schema bounds it (gt=0), so its builder refuses the config.
    path = write(tmp_path, RL_HEAD + "[verifier.options]\ntimeout_s = 0.0\n")
    with pytest.raises(UsageError) as info:
        load_config(path)
    assert "verifier.options.timeout_s: must be greater than 0, got 0.0" in info.value.message
