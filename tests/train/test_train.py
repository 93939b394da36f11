"""`synth-deploy train` end to end: the real CLI, the real math task app and our health check
served on 127.0.0.1, against the stand-in backend (tests/standins/backend.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from train_cli import APP_CONFIGS, FAST, env_file, run, sft_workspace

from synth_deploy.env import Env, load_env
from synth_deploy.errors import UsageError
from synth_deploy.train import TrainOptions, TrainUI, train


@pytest.fixture
def rl_env(work, backend, synth_key, api_key, math_server) -> str:
    return env_file(work, SYNTH_API_KEY=synth_key, ENVIRONMENT_API_KEY=api_key,
                    TASK_APP_URL=math_server.url, SYNTH_BACKEND_URL=backend.url)


def rl(env: str, *extra: str):
    return run("--config", str(APP_CONFIGS / "rl.toml"), "--env-file", env, *FAST, *extra)


def test_rl_job_is_preflighted_created_once_and_followed_to_success(backend, rl_env,
                                                                    math_server, synth_key):
    result = rl(rl_env, "--idempotency", "idem-1")
    assert result.exit_code == 0, result.output
    (job,) = backend.jobs.values()
    assert job.idempotency_key == "idem-1"
    body = job.payload
    assert body["job_type"] == "rl" and body["tags"] == {"source": "synth-deploy"}
    assert body["data"]["endpoint_base_url"] == math_server.url  # TASK_APP_URL beats the config
    assert body["data"]["config"]["services"]["task_url"] == math_server.url
    assert body["data"]["base_model"] == "Qwen/Qwen3-4B"
    assert "smoke" not in body["data"]["config"] and body["compute"]["gpu_count"] == 2
    paths = [p for _m, p in backend.requests]
    assert paths.index("/api/rl/verify_task_app") < paths.index("/api/rl/jobs")
    assert "rl.succeeded" in result.output and f"job {job.id} succeeded" in result.output
    assert synth_key not in result.output


def test_502s_on_create_still_make_exactly_one_job(backend, rl_env):
    backend.faults.fail_creates = 2
    result = rl(rl_env, "--idempotency", "idem-502", "--no-poll")
    assert result.exit_code == 0, result.output
    assert backend.create_attempts["idem-502"] == 3
    assert len(backend.jobs_for_key("idem-502")) == 1 and len(backend.jobs) == 1
    assert "retrying (1) after HTTP 502" in result.output


def test_generated_idempotency_key_is_reused_on_retry(backend, rl_env):
    backend.faults.fail_creates = 1
    result = rl(rl_env, "--no-poll")
    assert result.exit_code == 0, result.output
    ((key, attempts),) = backend.create_attempts.items()
    assert key and key.startswith("synth-deploy-") and attempts == 2
    assert len(backend.jobs) == 1


def test_a_create_answered_with_a_page_names_the_key_that_finds_the_job(backend, rl_env):
    # The proxy's page came after the backend recorded the job (issue 38): the error gives
    # the key, and a second run with it gets that job, not another.
    backend.faults.html_creates = 1
    first = rl(rl_env, "--no-poll")
    assert first.exit_code == 1, first.output
    [key] = backend.create_attempts
    assert "non-JSON" in first.output and f"--idempotency {key}" in first.output
    again = rl(rl_env, "--no-poll", "--idempotency", key)
    assert again.exit_code == 0, again.output
    assert len(backend.jobs) == 1 and backend.create_attempts[key] == 2


@pytest.mark.slow
def test_a_create_that_never_answers_names_the_key_that_finds_the_job(backend, rl_env):
    from synth_deploy.errors import JobError
    from synth_deploy.train import RetryPolicy

    backend.faults.stall_creates, backend.faults.stall_s = 2, 4.0
    options = TrainOptions(configs=[APP_CONFIGS / "rl.toml"], poll=False,
                           request_timeout_s=1.5, retry=RetryPolicy(retries=1, backoff_s=0.01))
    with pytest.raises(JobError) as failed:
        train(options, load_env([rl_env]))
    [key] = backend.create_attempts
    assert "failed after 2 attempts" in failed.value.message
    assert f"run it again with --idempotency {key}" in failed.value.hint
    [result] = train(replace(options, idempotency_key=key), load_env([rl_env]))
    assert [job.id for job in backend.jobs.values()] == [result.job_id]


def test_a_refused_create_does_not_suggest_the_key(backend, rl_env):
    backend.faults.reject_payload = True
    result = rl(rl_env, "--no-poll")
    assert result.exit_code == 1 and "HTTP 422" in result.output
    assert "--idempotency" not in result.output


def test_failed_job_exits_1(backend, rl_env):
    backend.faults.job_fails = True
    result = rl(rl_env)
    assert result.exit_code == 1, result.output
    assert "rl.failed" in result.output and "CUDA OOM" in result.output


def test_slow_job_past_poll_timeout_exits_4(backend, rl_env):
    backend.faults.event_step_s = 30.0
    result = run("--config", str(APP_CONFIGS / "rl.toml"), "--env-file", rl_env,
                 "--poll-interval", "0.05", "--poll-timeout", "0.3")
    assert result.exit_code == 4, result.output
    assert "still" in result.output and len(backend.jobs) == 1


def test_slow_stream_is_followed_to_the_end_as_ndjson(backend, rl_env):
    backend.faults.event_step_s = 0.1
    result = rl(rl_env, "--stream-format", "json")
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    events = [r for r in records if r["record"] == "event"]
    assert [e["seq"] for e in events] == list(range(1, 7))
    assert {r["status"] for r in records if r["record"] == "status"} >= {"running", "succeeded"}
    assert [r["value"] for r in records if r["record"] == "metric"] == [2.0, 1.0, 0.6667]
    assert records[-1]["record"] == "outcome" and records[-1]["status"] == "succeeded"


def test_chart_stream_shows_the_loss(backend, rl_env):
    result = rl(rl_env, "--stream-format", "chart")
    assert result.exit_code == 0, result.output
    assert "loss" in result.output and "0.6667" in result.output and "█" in result.output


def test_backend_verification_failure_stops_before_create(backend, rl_env):
    backend.env_keys = ["sk_env_not_the_apps_key"]
    result = rl(rl_env)
    assert result.exit_code == 1, result.output
    assert "could not verify the task app" in result.output
    assert "synth-deploy setup" in result.output
    assert backend.jobs == {}


def test_health_check_failure_stops_before_create(work, backend, synth_key, math_server):
    env = env_file(work, SYNTH_API_KEY=synth_key, ENVIRONMENT_API_KEY="sk_env_wrong_key_123",
                   TASK_APP_URL=math_server.url, SYNTH_BACKEND_URL=backend.url)
    result = rl(env)
    assert result.exit_code == 1, result.output
    assert "failed the health check" in result.output
    assert "sk_env_wrong_key_123" not in result.output
    assert backend.jobs == {}


def test_unreachable_task_app_exits_3(work, backend, synth_key, api_key):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    backend.faults.verify_says_ok = True  # so that our own checker meets the dead URL
    env = env_file(work, SYNTH_API_KEY=synth_key, ENVIRONMENT_API_KEY=api_key,
                   SYNTH_BACKEND_URL=backend.url)
    result = rl(env, "--task-url", dead)
    assert result.exit_code == 3, result.output
    assert backend.jobs == {}


@pytest.mark.parametrize("missing, advice", [
    ("SYNTH_API_KEY", "Synth dashboard"),
    ("ENVIRONMENT_API_KEY", "synth-deploy setup"),
    ("TASK_APP_URL", "--task-url"),
])
def test_missing_key_is_named_with_how_to_set_it_before_any_request(
        work, backend, synth_key, api_key, tmp_path, missing, advice):
    values = {"SYNTH_API_KEY": synth_key, "ENVIRONMENT_API_KEY": api_key,
              "TASK_APP_URL": "http://127.0.0.1:9", "SYNTH_BACKEND_URL": backend.url}
    del values[missing]
    config = tmp_path / "rl.toml"  # a config without [services].task_url
    text = (APP_CONFIGS / "rl.toml").read_text().replace('task_url = "http://127.0.0.1:8001"\n',
                                                         "")
    config.write_text(text)
    result = run("--config", str(config), "--env-file", env_file(work, **values))
    assert result.exit_code == 2, result.output
    assert f"missing {missing}" in result.output and advice in result.output
    assert backend.requests == []


def test_dry_run_prints_the_payload_masked_and_sends_nothing(backend, rl_env, synth_key,
                                                             math_server):
    result = rl(rl_env, "--dry-run", "--idempotency", "idem-dry", "--model", "ft:abc",
                "--allow-experimental")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    create = plan["create"]
    assert create["path"] == "/api/rl/jobs" and create["headers"]["Idempotency-Key"] == "idem-dry"
    assert create["headers"]["Authorization"].startswith("Bearer **** (sha256:")
    # --model goes where synth-ai's builder puts its override; the config is sent as written.
    assert create["json"]["data"]["model"] == "ft:abc"
    assert "base_model" not in create["json"]["data"]
    assert create["json"]["data"]["config"]["model"]["base"] == "Qwen/Qwen3-4B"
    assert create["json"]["allow_experimental"] is True
    assert synth_key not in result.output
    assert backend.requests == []


@pytest.mark.parametrize("stream_format", ["cli", "json"])
def test_a_password_in_the_backend_or_task_url_is_never_printed(backend, rl_env, math_server,
                                                                 stream_format):
    userinfo = "user:hunter2-pass@"
    result = rl(rl_env, "--dry-run", "--stream-format", stream_format,
                "--backend", backend.url.replace("http://", "http://" + userinfo),
                "--task-url", math_server.url.replace("http://", "http://" + userinfo))
    assert result.exit_code == 0, result.output
    assert "hunter2-pass" not in result.output
    plan = json.loads(result.stdout)
    assert plan["backend"].startswith("http://****@127.0.0.1:")
    assert plan["preflight"][1]["health_check"].startswith("http://****@127.0.0.1:")


def test_progress_lines_name_the_task_app_without_its_password(backend, rl_env, math_server):
    # The health check refuses a URL with credentials; no line that names it shows them.
    backend.faults.verify_says_ok = True
    url = math_server.url.replace("http://", "http://user:hunter2-pass@")
    result = rl(rl_env, "--task-url", url, "--no-poll")
    assert result.exit_code == 2, result.output
    assert "verifying task app http://****@127.0.0.1" in result.output
    assert "checking http://****@127.0.0.1" in result.output
    assert "hunter2-pass" not in result.output and backend.jobs == {}


def test_rejected_payload_prints_masked_payload_and_body(backend, rl_env, synth_key, api_key):
    backend.faults.reject_payload = True
    result = rl(rl_env)
    assert result.exit_code == 1, result.output
    assert "HTTP 422" in result.output
    assert "request payload (secrets masked)" in result.output
    assert '"endpoint_base_url"' in result.output
    assert "response body:" in result.output and "batch_size must be > 0" in result.output
    assert synth_key not in result.output and api_key not in result.output


def test_sft_job_uploads_a_truncated_copy_waits_for_ready_creates_and_starts(
        work, backend, synth_key):
    backend.faults.file_ready_after_s = 0.3
    config = sft_workspace(work)
    env = env_file(work, SYNTH_API_KEY=synth_key, SYNTH_BACKEND_URL=backend.url)
    result = run("--config", str(config), "--env-file", env, "--examples", "2", *FAST,
                 "--idempotency", "sft-1")
    assert result.exit_code == 0, result.output
    (upload,) = backend.files.values()
    assert len(upload["content"].decode().splitlines()) == 2
    polls = [p for m, p in backend.requests if m == "GET" and p.startswith("/api/files/")]
    assert len(polls) >= 2  # it really waited through "processing"
    (job,) = backend.jobs.values()
    assert job.payload["training_file_id"] == upload["id"]
    assert job.payload["training_type"] == "sft_offline"
    assert job.payload["model"] == "Qwen/Qwen3-0.6B"
    assert job.payload["hyperparameters"]["n_epochs"] == 1
    assert job.payload["metadata"]["effective_config"] == {
        "compute": {"gpu_type": "H100", "gpu_count": 1}, "data": {"topology": {}},
        "training": {"mode": "lora"}}
    assert ("POST", f"/api/learning/jobs/{job.id}/start") in backend.requests
    assert "sft.succeeded" in result.output
    assert len(list(work.iterdir())) == 3  # config, data, env: nothing left behind here


def test_sft_dataset_flag_and_bad_lines_are_reported_before_upload(work, backend, synth_key):
    config = sft_workspace(work)
    bad = work / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "x"}]}\n{oops\n\n'
                   '{"messages": []}\n')
    env = env_file(work, SYNTH_API_KEY=synth_key, SYNTH_BACKEND_URL=backend.url)
    result = run("--config", str(config), "--env-file", env, "--dataset", str(bad))
    assert result.exit_code == 2, result.output
    assert f"{bad}:2: invalid JSON" in result.output
    assert f"{bad}:4: messages: must hold at least one message" in result.output
    assert backend.requests == []


def test_several_configs_run_in_order_and_stop_after_the_first_failure(
        work, backend, synth_key, api_key, math_server):
    backend.faults.job_fails = True
    config = sft_workspace(work)
    env = env_file(work, SYNTH_API_KEY=synth_key, ENVIRONMENT_API_KEY=api_key,
                   TASK_APP_URL=math_server.url, SYNTH_BACKEND_URL=backend.url)
    result = run("--config", str(APP_CONFIGS / "rl.toml"), "--config", str(config),
                 "--env-file", env, *FAST, "--idempotency", "multi")
    assert result.exit_code == 1, result.output
    assert [j.kind for j in backend.jobs.values()] == ["rl"]
    assert backend.files == {}
    assert list(backend.by_key) == ["multi-1"]


def test_several_configs_all_run_with_one_key_each(work, backend, synth_key, api_key,
                                                   math_server):
    config = sft_workspace(work)
    env = env_file(work, SYNTH_API_KEY=synth_key, ENVIRONMENT_API_KEY=api_key,
                   TASK_APP_URL=math_server.url, SYNTH_BACKEND_URL=backend.url)
    result = run("--config", str(APP_CONFIGS / "rl.toml"), "--config", str(config),
                 "--env-file", env, *FAST, "--idempotency", "multi")
    assert result.exit_code == 0, result.output
    assert [j.kind for j in backend.jobs.values()] == ["rl", "learning"]
    assert sorted(backend.by_key) == ["multi-1", "multi-2"]


def test_without_config_and_without_a_terminal_it_lists_what_it_found(work, backend):
    sft_workspace(work)
    result = run()
    assert result.exit_code == 2, result.output
    assert "found 1 config(s)" in result.output and "sft.toml" in result.output
    assert backend.requests == []


def test_bad_config_is_a_usage_error_before_any_request(work, backend, synth_key):
    (work / "rl.toml").write_text('[algorithm]\ntype = "online"\nmethod = "policy_gradient"\n'
                                  '[training]\nbatch_size = "ten"\n')
    env = env_file(work, SYNTH_API_KEY=synth_key, SYNTH_BACKEND_URL=backend.url)
    result = run("--config", "rl.toml", "--env-file", env)
    assert result.exit_code == 2
    assert "training.batch_size: expected an integer, got 'ten'" in result.output
    assert backend.requests == []


def test_bad_flags_are_usage_errors(work):
    assert run("--config", "x.toml", "--stream-format", "tui").exit_code == 2
    assert run("--config", "x.toml", "--poll-timeout", "0").exit_code == 2


def test_declining_the_confirmation_submits_nothing(backend, rl_env):
    asked = []
    ui = TrainUI(confirm=lambda job: asked.append(job.payload) or False)
    with pytest.raises(UsageError, match="declined"):
        train(TrainOptions(configs=[APP_CONFIGS / "rl.toml"]), load_env([rl_env]), ui)
    assert len(asked) == 1 and asked[0]["job_type"] == "rl"
    assert backend.requests == []


def test_keys_and_urls_come_from_the_env_given_not_the_process(work, backend, synth_key,
                                                                api_key, math_server,
                                                                monkeypatch):
    monkeypatch.setenv("SYNTH_BACKEND_URL", "http://127.0.0.1:9")  # must not be read
    env = Env(values={"SYNTH_API_KEY": synth_key, "ENVIRONMENT_API_KEY": api_key,
                      "TASK_APP_URL": math_server.url, "SYNTH_BACKEND_URL": backend.url})
    options = TrainOptions(configs=[APP_CONFIGS / "rl.toml"], poll=False,
                           idempotency_key="idem-env")
    (result,) = train(options, env)
    assert result.job_id == backend.jobs_for_key("idem-env")[0].id and result.exit_code == 0
    assert backend.jobs_for_key("idem-env")[0].payload["data"]["endpoint_base_url"] == (
        math_server.url)
    with pytest.raises(UsageError, match="missing SYNTH_API_KEY"):
        train(options, Env())


@pytest.mark.parametrize("bad, message", [
    (dict(configs=[]), "no config given"),
    (dict(examples=0), "--examples must be at least 1"),
    (dict(poll_interval_s=0), "must be positive"),
])
def test_options_that_cannot_work_are_refused_when_built(bad, message):
    with pytest.raises(UsageError, match=message):
        TrainOptions(**{"configs": [APP_CONFIGS / "rl.toml"], **bad})


def test_backend_text_with_markup_is_printed_verbatim(backend, rl_env):
    step = "<s>[INST] sort arr[i] [/INST] [bold]kept[/bold]"
    backend.faults.step_message = step
    backend.faults.job_fails = True
    backend.faults.error_message = "crashed at arr[i] [/INST] [red]"
    result = rl(rl_env)
    assert result.exit_code == 1, result.output
    assert step in result.output
    assert "job_0001 failed crashed at arr[i] [/INST] [red]" in result.output


@pytest.mark.parametrize("suffix", ["/verify_task_app", "/events"])
@pytest.mark.parametrize("fmt", ["cli", "json"])
def test_refusals_during_preflight_and_streaming_are_shown_masked(backend, rl_env, synth_key,
                                                                  suffix, fmt):
    backend.faults.refuse_path_suffix = suffix
    result = rl(rl_env, "--stream-format", fmt)
    assert result.exit_code == 1, result.output
    assert "HTTP 400" in result.output and "refused request with Authorization" in result.output
    assert synth_key not in result.output and "**** (sha256:" in result.output


def test_ndjson_stream_cut_by_an_error_has_no_invented_outcome(backend, rl_env):
    backend.faults.refuse_path_suffix = "/metrics"
    result = rl(rl_env, "--stream-format", "json")
    assert result.exit_code == 1, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r for r in records if r.get("record") == "event"]
    assert not [r for r in records if r.get("record") == "outcome"]
    assert records[-1]["ok"] is False and records[-1]["error"]["status"] == 400


def test_dry_run_refuses_infinity_before_printing_json(backend, rl_env, tmp_path):
    config = tmp_path / "rl.toml"
    config.write_text((APP_CONFIGS / "rl.toml").read_text()
                      + '\n[vllm]\nbudget = inf\n')
    result = run("--config", str(config), "--env-file", rl_env, "--dry-run")
    assert result.exit_code == 2, result.output
    assert "vllm.budget: expected a finite number, got inf" in result.output
    assert "Infinity" not in result.output and "Traceback" not in result.output
    assert backend.requests == []
