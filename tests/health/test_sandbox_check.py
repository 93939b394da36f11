"""`check --rollout` on an app that runs code in sandboxes: a line saying they start and how
long one takes, and a named diagnosis when they cannot."""

from __future__ import annotations

import pytest

from synth_deploy.health import CheckOptions, RolloutOptions, check
from synth_deploy.sandbox import LocalBackend, use_backend
from synth_deploy.serving import create_app
from synth_deploy.taskapp.registry import load_app


@pytest.fixture
def code_app(serve, api_key):
    return serve(create_app(load_app("code").build_config(), api_keys=[api_key]))


def rollout_check(url, api_key, mock_policy):
    return check(url, api_key, CheckOptions(seeds=(0,), rollout=RolloutOptions(
        inference_url=mock_policy.url + "/v1", model="mock")))


def test_check_says_the_sandboxes_start_and_how_long_one_takes(code_app, api_key, mock_policy,
                                                                sandbox_root):
    use_backend(LocalBackend(sandbox_root))
    try:
        report = rollout_check(code_app.url, api_key, mock_policy)
    finally:
        use_backend(None)
    assert report.healthy, report.to_dict()
    (line,) = [r for r in report.checks if r.name == "sandboxes"]
    assert line.verdict == "pass" and line.actual.startswith("1 sandbox started (local) in ")
    assert "3 commands" in line.actual and line.latency_ms > 0


def test_a_sandbox_that_cannot_start_is_named(code_app, api_key, mock_policy, tmp_path):
    backend = LocalBackend(tmp_path / "closed" / "sandboxes")
    if not backend.own_users:
        pytest.skip("only a root server refuses a folder its sandboxes could not pass")
    use_backend(backend)
    try:
        report = rollout_check(code_app.url, api_key, mock_policy)
    finally:
        use_backend(None)
    assert not report.healthy
    failure = report.failure
    assert failure.name == "rollout" and failure.code == "sandbox_failed"
    assert "closed to other users" in failure.actual and "sandbox" in failure.hint


def test_an_app_without_sandboxes_has_no_sandbox_line(math_server, api_key, mock_policy):
    report = rollout_check(math_server.url, api_key, mock_policy)
    assert report.healthy and [r for r in report.checks if r.name == "sandboxes"] == []
