"""The one place env files and secrets are handled."""

from __future__ import annotations

import pytest

from synth_deploy.env import (
    fingerprint,
    is_secret_name,
    load_env,
    mask,
    mask_secrets,
    mint_key,
    parse_env_file,
    redact,
    redact_userinfo,
    write_env_var,
)
from synth_deploy.errors import EnvFileError

EXISTING = """# my project
export OPENAI_API_KEY=sk-openai-1
QUOTED="a value # not a comment"
ENVIRONMENT_API_KEY=old-key

TASK_APP_URL=http://127.0.0.1:8001
"""


def test_write_env_var_replaces_in_place_and_keeps_every_other_line(tmp_path):
    path = tmp_path / ".env"
    path.write_text(EXISTING)
    write_env_var(path, "ENVIRONMENT_API_KEY", "new-key")
    lines = path.read_text().splitlines()
    assert lines == EXISTING.replace("old-key", "new-key").splitlines()
    write_env_var(path, "SYNTH_API_KEY", "sk synth with spaces")
    values = parse_env_file(path)
    assert values["SYNTH_API_KEY"] == "sk synth with spaces"
    assert values["QUOTED"] == "a value # not a comment"
    assert values["OPENAI_API_KEY"] == "sk-openai-1"
    assert path.read_text().startswith("# my project\n")


def test_write_env_var_creates_a_private_file(tmp_path):
    path = tmp_path / "sub" / ".env"
    write_env_var(path, "A", "1")
    assert parse_env_file(path) == {"A": "1"}
    assert path.stat().st_mode & 0o077 == 0


def test_bad_line_names_file_and_line_without_the_value(tmp_path):
    path = tmp_path / ".env"
    path.write_text("GOOD=1\nthis is not an assignment sk-secret-value\nOTHER=2\n")
    with pytest.raises(EnvFileError) as info:
        parse_env_file(path)
    assert f"{path}:2" in str(info.value)
    assert "sk-secret-value" not in str(info.value)


def test_missing_env_file_is_a_usage_error(tmp_path):
    with pytest.raises(EnvFileError, match="not found"):
        load_env([tmp_path / "nope.env"])


def test_precedence_explicit_file_over_process_over_implicit_dotenv(tmp_path):
    (tmp_path / ".env").write_text("A=dotenv\nB=dotenv\nC=dotenv\n")
    explicit = tmp_path / "explicit.env"
    explicit.write_text("A=explicit\n")
    implicit = load_env(environ={"B": "process"}, cwd=tmp_path)
    assert (implicit.get("B"), implicit.get("C")) == ("process", "dotenv")
    assert implicit.source("C") == str(tmp_path / ".env")
    assert implicit.source("B") == "environment"
    both = load_env([explicit], environ={"A": "process", "B": "process"}, cwd=tmp_path)
    assert both.get("A") == "explicit" and both.get("C") is None  # no implicit .env then
    assert both.source("A") == str(explicit)


def test_api_keys_include_aliases():
    env = load_env(environ={"ENVIRONMENT_API_KEY": "k1",
                            "ENVIRONMENT_API_KEY_ALIASES": " k2, ,k3"}, cwd="/nonexistent")
    assert env.api_keys() == ["k1", "k2", "k3"]


def test_mask_shows_no_key_material():
    key = mint_key()
    shown = mask(key)
    # (the fingerprint is taken out first: its hex digits may spell the length by chance)
    rest = shown.replace(fingerprint(key), "")
    assert key[7:15] not in shown and str(len(key)) not in rest and rest.startswith("****")
    assert fingerprint(key) in shown and fingerprint(key) != fingerprint(mint_key())
    assert redact(f"token={key}!", [key]) == f"token={shown}!"
    assert repr(load_env(environ={"X_TOKEN": key}, cwd="/nonexistent")).count(key) == 0


@pytest.mark.parametrize("name", ["OPENAI_API_KEY", "MODAL_TOKEN_ID", "TURSO_AUTH_TOKEN",
                                  "Authorization", "authToken", "x-api-keys", "APIKey",
                                  "client_secret", "db.password", "X-Amz-Signature"])
def test_a_name_holding_a_credential_is_secret(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["max_tokens", "max_completion_tokens", "keyboard", "author",
                                  "monkey", "TASK_APP_URL", "PWD", "model"])
def test_a_name_merely_containing_such_a_word_is_not(name):
    # Masking "max_tokens" in a stored request lost what the policy was asked for.
    assert not is_secret_name(name)


def test_every_secret_in_nested_json_is_masked_and_the_rest_kept():
    data = {"policy": {"config": {
        "inference_url": "http://u:pw1@h:8/v1?cid=c1&api_key=k1&token=",
        "headers": {"Authorization": "Bearer k2", "Accept": "x"}, "api_keys": ["k3", None],
        "extra_body": [{"apiKey": 7}], "max_tokens": 9}},
        "env": {"config": {"openai_api_key": "k4", "note": "see https://u:pw2@h/"}}}
    masked = mask_secrets(data)
    config = masked["policy"]["config"]
    assert config["inference_url"] == "http://****@h:8/v1?cid=c1&api_key=****&token="
    assert config["headers"] == {"Authorization": mask("Bearer k2"), "Accept": "x"}
    assert config["api_keys"] == [mask("k3"), None]
    assert config["extra_body"] == [{"apiKey": mask("7")}] and config["max_tokens"] == 9
    assert masked["env"]["config"] == {"openai_api_key": mask("k4"),
                                       "note": "see https://****@h/"}
    assert mask_secrets("libsql://db?authToken=t1") == "libsql://db?authToken=****"


def test_a_url_in_text_keeps_everything_but_its_credentials():
    text = "GET http://a:b@h/p?x=1&sig=2&access_token=3#f failed; retry?api_key=4"
    assert redact_userinfo(text) == ("GET http://****@h/p?x=1&sig=2&access_token=****#f failed; "
                                     "retry?api_key=****")


def test_a_nul_byte_names_the_line_and_its_variable_not_the_value(tmp_path):
    path = tmp_path / ".env"
    path.write_bytes(b"GOOD=1\n# note\nOPENAI_API_KEY=sk-sec\x00ret\nOTHER=2\n")
    with pytest.raises(EnvFileError) as info:
        load_env([path])
    said = str(info.value)
    assert f"{path}:3: the line for OPENAI_API_KEY holds a NUL byte" in said, said
    assert "sk-sec" not in said and info.value.hint


def test_a_file_that_is_not_utf8_names_the_line_not_a_byte_offset(tmp_path):
    path = tmp_path / ".env"
    path.write_bytes(b"GOOD=1\nOTHER=2\nPASSWORD=caf\xe9-secret\n")
    with pytest.raises(EnvFileError) as info:
        parse_env_file(path)
    said = str(info.value)
    assert f"{path}:3: the line for PASSWORD is not UTF-8" in said, said
    assert "secret" not in said and "position" not in said and "UTF-8" in info.value.hint
