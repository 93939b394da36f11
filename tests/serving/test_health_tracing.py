"""/health says where the traces go and how many sessions this process has stored."""

from __future__ import annotations

import httpx
from rollouts import rollout_body
from typer.testing import CliRunner

from synth_deploy.cli import app as cli_app
from synth_deploy.env import Env
from synth_deploy.health import check
from synth_deploy.serving import LocalRunner, ServerKeys, ServeSettings
from synth_deploy.tracing import parse_trace_db


def _health(url: str, key: str) -> dict:
    return httpx.get(url + "/health", headers={"X-API-Key": key}, timeout=5).json()["tracing"]


def test_health_names_the_store_and_counts_stored_sessions(tmp_path, api_key, mock_policy):
    db = tmp_path / "t.db"
    settings = ServeSettings(app="math", env=Env(), keys=ServerKeys((api_key,), "test"),
                             traces=parse_trace_db(str(db)))
    with LocalRunner(settings).start() as runner:
        assert _health(runner.url, api_key) == {"enabled": True, "destination": str(db),
                                                "durable": True, "sessions": 0}
        for i in range(2):
            body = rollout_body(f"r{i}", i, mock_policy.url + "/v1")
            assert httpx.post(runner.url + "/rollout", json=body, timeout=30,
                              headers={"X-API-Key": api_key}).status_code == 200
        assert _health(runner.url, api_key)["sessions"] == 2


def test_health_of_an_untraced_app(api_key):
    settings = ServeSettings(app="math", env=Env(), keys=ServerKeys((api_key,), "test"))
    with LocalRunner(settings).start() as runner:
        assert _health(runner.url, api_key) == {"enabled": False, "destination": None,
                                                "durable": False, "sessions": 0}


def test_check_reports_where_the_traces_go(tmp_path, api_key):
    db = tmp_path / "t.db"
    settings = ServeSettings(app="math", env=Env(), keys=ServerKeys((api_key,), "test"),
                             traces=parse_trace_db(str(db)))
    with LocalRunner(settings).start() as runner:
        report = check(runner.url, api_key)
        result = CliRunner().invoke(cli_app, ["check", runner.url, "--api-key", api_key])
    assert report.healthy and report.to_dict()["traces"] == {
        "enabled": True, "destination": str(db), "durable": True, "sessions": 0}
    assert f"traces: {db} (0 sessions in this process)" in result.output.replace("\n", "")


def test_check_rollouts_session_is_in_its_count_as_in_health(tmp_path, api_key, mock_policy):
    from synth_deploy.health import CheckOptions, RolloutOptions

    db = tmp_path / "t.db"
    settings = ServeSettings(app="math", env=Env(), keys=ServerKeys((api_key,), "test"),
                             traces=parse_trace_db(str(db)))
    with LocalRunner(settings).start() as runner:
        for i in range(3):  # sessions stored before the check
            httpx.post(runner.url + "/rollout", json=rollout_body(f"r{i}", i,
                                                                  mock_policy.url + "/v1"),
                       headers={"X-API-Key": api_key}, timeout=30).raise_for_status()
        report = check(runner.url, api_key, CheckOptions(
            rollout=RolloutOptions(inference_url=mock_policy.url + "/v1")))
        assert report.healthy, report.to_dict()
        assert report.traces["sessions"] == _health(runner.url, api_key)["sessions"] == 4
