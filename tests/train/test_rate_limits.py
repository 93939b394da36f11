"""`synth-deploy train` against a backend that rate-limits (issue 12): 429 and 408 on job
creation and while following a job are waited out as ``Retry-After`` asks (bounded), with the
same idempotency key, and the screen says so. The real CLI, the real math app and the
stand-in backend (tests/standins/backend.py), all on 127.0.0.1."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from synth_deploy.cli import app
from synth_deploy.errors import JobHTTPError
from synth_deploy.train import JobClient, RetryPolicy, retry_after_s

RL_CONFIG = Path(__file__).parents[2] / "apps" / "math" / "configs" / "rl.toml"
CREATE = r"^POST /api/rl/jobs$"
STATUS = r"^GET /api/rl/jobs/[^/]+$"


@pytest.fixture
def rl_env(tmp_path, monkeypatch, backend, synth_key, api_key, math_server) -> str:
    for name in ("SYNTH_API_KEY", "ENVIRONMENT_API_KEY", "TASK_APP_URL", "SYNTH_BACKEND_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "400")
    path = tmp_path / "test.env"
    path.write_text(f"SYNTH_API_KEY={synth_key}\nENVIRONMENT_API_KEY={api_key}\n"
                    f"TASK_APP_URL={math_server.url}\nSYNTH_BACKEND_URL={backend.url}\n")
    return str(path)


def train(env: str, *extra: str):
    return CliRunner().invoke(app, ["train", "--config", str(RL_CONFIG), "--env-file", env,
                                    "--poll-interval", "0.02", "--poll-timeout", "30", *extra],
                              catch_exceptions=False)


def test_a_rate_limited_create_is_waited_out_with_the_same_key(backend, rl_env):
    backend.faults.throttle, backend.faults.throttle_count = CREATE, 2
    started = time.monotonic()
    result = train(rl_env, "--idempotency", "idem-429", "--no-poll")
    assert result.exit_code == 0, result.output
    assert time.monotonic() - started >= 1.9  # two waits of Retry-After: 1
    assert [key for _m, _p, key in backend.throttled] == ["idem-429", "idem-429"]
    assert backend.create_attempts == {"idem-429": 1} and len(backend.jobs) == 1
    assert "HTTP 429 (rate limited); waiting 1s as the backend's Retry-After asks" in \
        result.output
    assert "retrying (2)" in result.output


def test_a_408_on_create_is_retried(backend, rl_env):
    backend.faults.throttle, backend.faults.throttle_count = CREATE, 1
    backend.faults.throttle_status, backend.faults.retry_after = 408, None
    result = train(rl_env, "--idempotency", "idem-408", "--no-poll")
    assert result.exit_code == 0, result.output
    assert "HTTP 408 (request timeout); waiting" in result.output
    assert len(backend.jobs_for_key("idem-408")) == 1


def test_a_429_while_following_does_not_abandon_the_job(backend, rl_env):
    backend.faults.throttle, backend.faults.throttle_count = STATUS, 1
    result = train(rl_env)
    assert result.exit_code == 0, result.output
    (job,) = backend.jobs.values()
    assert backend.throttled == [("GET", f"/api/rl/jobs/{job.id}", None)]
    assert f"job {job.id} succeeded" in result.output
    assert "HTTP 429 (rate limited); waiting 1s" in result.output


def test_the_wait_is_bounded_and_says_it_was_capped(backend, synth_key):
    backend.faults.throttle, backend.faults.throttle_count = r"^GET /api/files/", 1
    backend.faults.retry_after = "3600"
    reasons: list[str] = []
    with JobClient(backend.url, synth_key, retry=RetryPolicy(max_retry_after_s=0.2),
                   on_retry=lambda n, why: reasons.append(why)) as client:
        started = time.monotonic()
        with pytest.raises(JobHTTPError) as err:  # past the limiter: the file is unknown
            client.get_file("file_missing")
        assert time.monotonic() - started < 5
    assert err.value.status == 404
    assert reasons == ["HTTP 429 (rate limited); waiting 0.2s as the backend's Retry-After "
                       "asks, capped from 3600s"]


def test_a_limiter_that_never_lets_up_ends_with_the_fix(backend, synth_key):
    backend.faults.throttle, backend.faults.throttle_count = r"^GET ", 100
    backend.faults.retry_after = "0"
    with JobClient(backend.url, synth_key, retry=RetryPolicy(retries=2)) as client:
        with pytest.raises(JobHTTPError) as err:
            client.get_job("rl", "job_0001")
    assert err.value.status == 429 and len(backend.throttled) == 3
    # A GET creates nothing: no key to name (a create names its own, see test_train.py).
    assert "rate limiting" in err.value.hint and "--idempotency" not in err.value.hint


@pytest.mark.parametrize("header, expected", [
    ("2", 2.0), (" 7 ", 7.0), ("0", 0.0), (None, None), ("", None), ("soon", None),
    ("-3", None), ("²", None),
    (format_datetime(datetime(2015, 10, 21, 7, 28, tzinfo=UTC), usegmt=True), 0.0),
])
def test_retry_after_is_seconds_or_an_http_date(header, expected):
    assert retry_after_s(header) == expected


def test_retry_after_as_a_future_date():
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    assert 25 <= retry_after_s(when) <= 31
