"""One URL rule for every command (issue 14): the same error, word for word, wherever a URL
without its scheme is given."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from processes import refused_in_process

from synth_deploy.urls import URLError, http_url, is_loopback, is_loopback_host, looks_like_url

ROOT = Path(__file__).resolve().parents[1]
RL_CONFIG = ROOT / "apps" / "math" / "configs" / "rl.toml"
SCHEMELESS = "127.0.0.1:8001"


def rule(text: str) -> URLError:
    with pytest.raises(URLError) as caught:
        http_url(text)
    return caught.value


@pytest.mark.parametrize(("text", "code"), [
    ("127.0.0.1:8001", "no_scheme"), ("my-app.modal.run", "no_scheme"),
    ("ftp://example.com", "bad_scheme"), ("http://", "no_host"),
    ("http://127.0.0.1:99999", "bad_port"), ("http://[::1", "invalid_url"), ("", "invalid_url"),
])
def test_the_rule_names_what_is_wrong(text, code):
    error = rule(text)
    assert error.code == code and error.exit_code == 2 and error.hint


def test_the_rule_normalises_what_it_accepts():
    assert http_url(" http://127.0.0.1:8001/ ") == "http://127.0.0.1:8001"
    assert http_url("https://a.modal.run/api/", what="--task-url") == "https://a.modal.run/api"
    with pytest.raises(URLError, match=r"^--task-url: '127.0.0.1:8001' has no scheme"):
        http_url(SCHEMELESS, what="--task-url")


@pytest.mark.parametrize(("text", "is_url"), [
    ("127.0.0.1:8001", True), ("localhost:8001", True), ("localhost", True),
    ("my-app.modal.run", True), ("[::1]:8001", True), ("http://x", True),
    ("math", False), ("tiny.py", False), ("apps/math/task_app.py", False), ("my_app", False),
])
def test_urls_are_told_from_app_ids_and_files(text, is_url):
    assert looks_like_url(text) is is_url


def test_loopback():
    assert is_loopback("http://127.0.0.1:8001") and is_loopback("http://localhost:1")
    assert is_loopback("http://[::1]:8001")
    assert not is_loopback("https://a.modal.run") and not is_loopback("http://10.0.0.5:80")
    # one rule wherever the kit asks (check's plain-http warning, rehearse's idle default,
    # smoke's mock-policy note, the viewer's Host check)
    for host in ("127.0.0.2", "127.255.0.1", "localhost", "LOCALHOST.", "app.localhost", "::1",
                 "[::1]"):
        assert is_loopback_host(host), host
    for host in ("localhost.evil.example", "10.0.0.1", "128.0.0.1", "0.0.0.0", "", "::"):
        assert not is_loopback_host(host), host


def _json_error(result) -> tuple[str, str]:
    # --json commands end with one line {"ok": false, "error": {...}} on stdout.
    error = json.loads(result.stdout.strip().splitlines()[-1])["error"]
    return error["message"], error["hint"]


def test_every_command_refuses_a_url_without_its_scheme_the_same_way(tmp_path):
    expected = rule(SCHEMELESS)
    results = {
        "smoke": refused_in_process(tmp_path, "smoke", SCHEMELESS, "--json", "--no-trace"),
        "eval": refused_in_process(tmp_path, "eval", SCHEMELESS, "--json", "--no-trace"),
        "train": refused_in_process(tmp_path, "train", "--config", str(RL_CONFIG),
                                    "--task-url", SCHEMELESS, "--dry-run",
                                    "--stream-format", "json"),
        "tunnel": refused_in_process(tmp_path, "tunnel", "--url", SCHEMELESS, "--json"),
    }
    for command, result in results.items():
        assert result.exit_code == 2, (command, result.stdout, result.stderr)
        message, hint = _json_error(result)
        assert message.endswith(expected.message), (command, message)
        assert hint == expected.hint, command
    check = refused_in_process(tmp_path, "check", SCHEMELESS, "--json")
    assert check.exit_code == 2
    failure = json.loads(check.stdout)["failure"]
    assert (failure["actual"], failure["hint"]) == (expected.message, expected.hint)


def test_an_unknown_app_id_is_still_an_unknown_app(tmp_path):
    result = refused_in_process(tmp_path, "smoke", "mathh", "--json", "--no-trace")
    assert result.exit_code == 2
    message, hint = _json_error(result)
    assert message == "no task app with id 'mathh'" and hint == "did you mean 'math'?"
