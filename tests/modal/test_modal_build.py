"""Building the modal.App offline and inspecting what a deploy would send (no network)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from standins import modal_inspect

from synth_deploy.env import load_env, mask
from synth_deploy.errors import TaskAppError, UsageError
from synth_deploy.health import CheckOptions, RolloutOptions, check
from synth_deploy.modal import (
    CONTAINER_MEMORY_VAR,
    SERVING_PACKAGES,
    SOURCE_EXCLUDED_PACKAGES,
    DeployOptions,
    ModalSettings,
    build_modal_app,
    build_plan,
    container_memory,
    dependency_closure,
    find_web_url,
    web_function,
)
from synth_deploy.taskapp.registry import load_app
from synth_deploy.tracing import pending_limit, session_log

MATH_DIR = Path(__file__).resolve().parents[2] / "apps" / "math"


def _env(api_key: str, **extra: str):
    return load_env(environ={"ENVIRONMENT_API_KEY": api_key, **extra})


def _math(**settings):
    entry = load_app("math")
    return dataclasses.replace(entry, modal=ModalSettings(**settings)) if settings else entry


def test_settings_validate_with_field_paths():
    with pytest.raises(UsageError, match=r"ModalSettings.memory: must be a positive"):
        ModalSettings(memory=0)
    with pytest.raises(UsageError, match=r"ModalSettings.min_containers: 3 is more than"):
        ModalSettings(min_containers=3, max_containers=1)
    with pytest.raises(UsageError, match=r"ModalSettings.env.OPENAI_API_KEY: looks like a secret"):
        ModalSettings(env={"OPENAI_API_KEY": "sk-x"})
    with pytest.raises(UsageError, match=r"ModalSettings.volumes.data: mount paths must be abs"):
        ModalSettings(volumes={"data": "vol"})
    with pytest.raises(UsageError, match=r"ModalSettings.python_version"):
        ModalSettings(python_version="311")
    assert ModalSettings(pip_packages="numpy").pip_packages == ("numpy",)


def test_deploy_options_say_where_task_app_url_goes():
    assert DeployOptions().env_out_file == Path(".env")
    assert DeployOptions(env_files=("a.env", "b.env")).env_out_file == Path("b.env")
    assert DeployOptions(env_files=("a.env",), env_out="out.env").env_out_file == Path("out.env")
    with pytest.raises(UsageError, match="DeployOptions.deploy_timeout_s: must be more than 0"):
        DeployOptions(deploy_timeout_s=0)


def test_settings_and_package_import_without_modal():
    code = ("import sys; from synth_deploy.modal import ModalSettings; ModalSettings(cpu=2); "
            "from synth_deploy.taskapp.registry import load_app; load_app('math'); "
            "print(sorted(m for m in ('modal', 'uvicorn', 'libsql') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_math_app_builds_with_its_function_resources_and_secrets(api_key):
    plan = build_plan(load_app("math"), _env(api_key))
    app = build_modal_app(plan)
    assert app.name == "synth-math"
    info = web_function(app).info()
    math_settings = load_app("math").modal
    assert (info.cpu, info.memory_mib, info.timeout) == (
        math_settings.cpu, math_settings.memory, math_settings.timeout)
    assert info.concurrency_info.max_inputs == math_settings.concurrent_inputs
    spec = modal_inspect.function_spec(web_function(app))
    envs = [modal_inspect.secret_env(s) for s in spec.secrets]
    assert {"ENVIRONMENT_API_KEY": api_key} in envs
    # No remote store: the traces go to the app's Volume, mounted, named in the env.
    assert {"SYNTH_DEPLOY_TASK_APP": "task_app/task_app.py", "SYNTH_TRACE_VOLUME":
            "synth-math-traces", "SYNTH_TRACE_VOLUME_DIR": "/synth-traces/synth-math",
            "SYNTH_TRACE_COMMIT_S": "10", "SYNTH_CONTAINER_MEMORY_MIB": "512",
            "SYNTH_DEPLOY_ROLLOUT_DICT": "synth-math-rollouts"} in envs
    assert {p: modal_inspect.volume_name(v) for p, v in spec.volumes.items()} == {
        "/synth-traces": "synth-math-traces"}


def test_resources_volumes_named_secrets_and_forwarded_env(api_key, tmp_path):
    (tmp_path / "extra.env").write_text("VENDOR_TOKEN=vt-123456\n")
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    entry = dataclasses.replace(
        load_app("math"),
        modal=ModalSettings(name="custom", cpu=2.0, memory=2048, timeout=120, min_containers=1,
                            max_containers=3, concurrent_inputs=4, volumes={"/data": "vol-a"},
                            secret_names=["openai-prod"], forward_env=["OPENAI_API_KEY"],
                            env_files=[str(tmp_path / "extra.env")], env={"LOG_LEVEL": "debug"},
                            pip_packages=["numpy==2.0.0"], apt_packages=["git"]))
    plan = build_plan(entry, _env(api_key, OPENAI_API_KEY="sk-openai-999999"), name="over")
    assert plan.app_name == "over"
    app = build_modal_app(plan)
    fn = web_function(app)
    info = fn.info()
    assert (info.cpu, info.memory_mib, info.timeout) == (2.0, 2048, 120)
    assert info.concurrency_info.max_inputs == 4
    assert {p: v.name for p, v in info.volumes.items()} == {
        "/data": "vol-a", "/synth-traces": "over-traces"}  # named after the app
    spec = modal_inspect.function_spec(fn)
    assert [modal_inspect.secret_name(s) for s in spec.secrets
            if modal_inspect.secret_env(s) is None] == ["openai-prod"]
    merged = {k: v for s in spec.secrets for k, v in (modal_inspect.secret_env(s) or {}).items()}
    assert merged["OPENAI_API_KEY"] == "sk-openai-999999"
    assert merged["VENDOR_TOKEN"] == "vt-123456"
    assert merged["LOG_LEVEL"] == "debug"
    commands = modal_inspect.image_commands(spec.image)
    assert "RUN apt-get install -y git" in commands
    assert any("numpy==2.0.0" in c for c in commands)


def test_missing_forwarded_variable_is_a_clear_error(api_key):
    entry = _math(forward_env=["GROQ_API_KEY"])
    with pytest.raises(UsageError, match="forward_env: GROQ_API_KEY is not set") as exc:
        build_plan(entry, _env(api_key))
    assert "--env-file" in exc.value.hint


def test_missing_environment_api_key_stops_the_plan():
    with pytest.raises(UsageError, match="ENVIRONMENT_API_KEY is not set"):
        build_plan(load_app("math"), load_env(environ={}))


def test_image_holds_the_serving_set_and_no_secrets_dbs_caches_or_git(api_key, tmp_path):
    # A copy of the math app with everything that must stay out of an image next to it.
    app_dir = tmp_path / "mathcopy"
    app_dir.mkdir()
    for f in ("task_app.py", "math_problems.py"):
        (app_dir / f).write_text((MATH_DIR / f).read_text().replace('"math"', '"mathcopy"'))
    for junk in (".env", ".env.local", "traces/v3/synth_ai.db", "local.db", "x.db-wal",
                 "__pycache__/task_app.cpython-311.pyc", ".git/HEAD", ".venv/bin/python",
                 "data/keep.json"):
        (app_dir / junk).parent.mkdir(parents=True, exist_ok=True)
        (app_dir / junk).write_text("SECRET=should-not-ship\n")
    entry = load_app(str(app_dir / "task_app.py"))
    app = build_modal_app(build_plan(entry, _env(api_key)))
    image = modal_inspect.function_spec(web_function(app)).image
    commands = modal_inspect.image_commands(image)
    assert commands[0].startswith("FROM python:3.11")
    pip = modal_inspect.pip_requirements(image)
    assert sorted(p.split("==")[0] for p in pip) == sorted(SERVING_PACKAGES)
    assert not {"uvicorn", "modal", "typer", "rich"} & set(dependency_closure(pip))
    remote = {r for _, r in modal_inspect.image_files(image)}
    assert remote >= {"/root/task_app/task_app.py", "/root/task_app/math_problems.py",
                      "/root/task_app/data/keep.json", "/root/synth_deploy/serving/_server.py",
                      "/root/synth_deploy/modal/_container.py"}
    app_files = {r for r in remote if r.startswith("/root/task_app/")}
    assert app_files == {"/root/task_app/task_app.py", "/root/task_app/math_problems.py",
                         "/root/task_app/data/keep.json"}
    source = {r for r in remote if r.startswith("/root/synth_deploy/")}
    assert all(r.endswith(".py") for r in source)
    assert set(SOURCE_EXCLUDED_PACKAGES) == {"cli", "runs", "train", "tunnel", "health",
                                             "_apps"}
    assert not any(r.startswith(f"/root/synth_deploy/{p}/") for r in source
                   for p in SOURCE_EXCLUDED_PACKAGES)


def test_local_function_serves_the_app_and_passes_the_health_checker(
        api_key, serve, mock_policy, monkeypatch, tmp_path):
    app = build_modal_app(build_plan(load_app("math"), _env(api_key)))
    # What Modal's container gets: the function's env and the secret, as variables; its
    # traces go to the default file, under the working directory.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SYNTH_DEPLOY_TASK_APP", str(MATH_DIR / "task_app.py"))
    monkeypatch.setenv("ENVIRONMENT_API_KEY", api_key)
    asgi = web_function(app).local()
    server = serve(asgi)
    report = check(server.url, api_key, CheckOptions(
        seeds=(0, 1), rollout=RolloutOptions(inference_url=mock_policy.url + "/v1", model="mock")))
    assert report.healthy, report.to_dict()
    assert not check(server.url, "sk_env_wrong_key_000000").healthy


@pytest.mark.parametrize("switch", ["0", "1"])
def test_taskapp_tracing_enabled_switches_tracing_in_the_container(
        api_key, serve, mock_policy, monkeypatch, tmp_path, switch):
    app = build_modal_app(build_plan(load_app("math"), _env(api_key)))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SYNTH_DEPLOY_TASK_APP", str(MATH_DIR / "task_app.py"))
    monkeypatch.setenv("ENVIRONMENT_API_KEY", api_key)
    monkeypatch.setenv("TASKAPP_TRACING_ENABLED", switch)
    server = serve(web_function(app).local())
    report = check(server.url, api_key, CheckOptions(
        seeds=(0,), rollout=RolloutOptions(inference_url=mock_policy.url + "/v1", model="mock")))
    assert report.healthy, report.to_dict()
    health = httpx.get(server.url + "/health", headers={"X-API-Key": api_key}, timeout=5).json()
    assert health["tracing"]["enabled"] is (switch == "1")
    assert health["tracing"]["sessions"] == (1 if switch == "1" else 0)
    # No Volume in this environment (`.local()` mounts none): the container's disk, said so.
    assert health["tracing"]["durable"] is False
    if switch == "1":
        assert health["tracing"]["destination"] == "this container's disk (lost with it)"
    assert (tmp_path / "traces" / "v3" / "synth_ai.db").exists() is (switch == "1")


def test_a_tracing_switch_that_is_neither_0_nor_1_is_refused(api_key, monkeypatch):
    app = build_modal_app(build_plan(load_app("math"), _env(api_key)))
    monkeypatch.setenv("SYNTH_DEPLOY_TASK_APP", str(MATH_DIR / "task_app.py"))
    monkeypatch.setenv("ENVIRONMENT_API_KEY", api_key)
    monkeypatch.setenv("TASKAPP_TRACING_ENABLED", "maybe")
    with pytest.raises(TaskAppError, match="TASKAPP_TRACING_ENABLED='maybe'"):
        web_function(app).local()


def test_plan_shows_names_and_masked_values_only(api_key):
    plan = build_plan(load_app("math"), _env(api_key, SYNTH_TRACES_DB="libsql://db.example.io",
                                             TURSO_AUTH_TOKEN="turso-secret-7777"))
    text = repr(plan.to_dict()) + repr(plan)
    assert api_key not in text and "turso-secret-7777" not in text
    assert mask(api_key) in text and mask("turso-secret-7777") in text
    assert "remote libSQL" in plan.tracing
    assert any(p.startswith("libsql") for p in plan.image.pip_packages)
    assert plan.trace_volume is None  # one live store: no Volume
    local = build_plan(load_app("math"), _env(api_key, SYNTH_TRACES_DB="traces/x.db"))
    assert "traces go to the Modal Volume synth-math-traces" in local.tracing
    assert "traces pull synth-math" in local.tracing
    assert local.to_dict()["trace_volume"] == "synth-math-traces"
    assert "SYNTH_TRACES_DB" not in repr(local.to_dict()["secrets"])
    entry = dataclasses.replace(load_app("math"), modal=ModalSettings(trace_volume=False))
    off = build_plan(entry, _env(api_key))
    assert off.trace_volume is None and "lost when it stops" in off.tracing
    assert "SYNTH_TRACE_VOLUME" not in off.env
    named = dataclasses.replace(load_app("math"), modal=ModalSettings(
        trace_volume="team-traces", trace_commit_s=2.5))
    plan = build_plan(named, _env(api_key))
    assert (plan.trace_volume, plan.env["SYNTH_TRACE_COMMIT_S"]) == ("team-traces", "2.5")


@pytest.mark.parametrize(("settings", "field"), [
    ({"trace_volume": "no spaces allowed"}, "ModalSettings.trace_volume"),
    ({"trace_commit_s": 0}, "ModalSettings.trace_commit_s"),
])
def test_bad_trace_volume_settings_say_which_field(settings, field):
    with pytest.raises(UsageError, match=field):
        ModalSettings(**settings)


def test_a_volume_of_the_apps_own_on_the_trace_mount_is_refused(api_key):
    entry = dataclasses.replace(load_app("math"), modal=ModalSettings(
        volumes={"/synth-traces": "mine"}))
    with pytest.raises(UsageError, match="ModalSettings.volumes./synth-traces"):
        build_plan(entry, _env(api_key))


@pytest.mark.parametrize("output, url", [
    (["✓ Created objects.", "└── ✓ Created web function web",
      "    └── https://ws--synth-math-web.modal.run (unauthenticated)", "",
      "View Deployment: https://modal.com/apps/ws/main/deployed/synth-math"],
     "https://ws--synth-math-web.modal.run"),
    (["└── 🔨 Created web function web => https://ws-dev--synth-math-web.modal.run"],
     "https://ws-dev--synth-math-web.modal.run"),
    (["\x1b[32m✓\x1b[0m Created web function \x1b[32mweb\x1b[0m",
      "    └── \x1b]8;;https://a--b-web.modal.run\x1b\\https://a--b-web.modal.run\x1b]8;;\x1b\\"],
     "https://a--b-web.modal.run"),
    (["✓ App deployed in 1.0s! 🎉", "View Deployment: https://modal.com/apps/ws/main/x"], None),
])
def test_find_web_url(output, url):
    assert find_web_url(output) == url


def test_the_head_and_heartbeat_settings_reach_the_container(api_key):
    from synth_deploy.serving import HEAD_AFTER_VAR, HEARTBEAT_VAR

    entry = dataclasses.replace(load_app("math"),
                                modal=ModalSettings(head_after_s=5, heartbeat_s=2.5))
    plan = build_plan(entry, _env(api_key))
    assert plan.env[HEAD_AFTER_VAR] == "5" and plan.env[HEARTBEAT_VAR] == "2.5"
    assert HEAD_AFTER_VAR not in build_plan(load_app("math"), _env(api_key)).env


def test_the_session_log_holds_a_quarter_of_the_containers_memory(
        api_key, serve, monkeypatch, tmp_path):
    # The math app asks Modal for 512 MiB: its log refuses sessions past 128 MiB held, long
    # before the container runs out of memory (the limit used to be 256 MiB, whatever it had).
    plan = build_plan(load_app("math"), _env(api_key))
    assert plan.env[CONTAINER_MEMORY_VAR] == "512"
    assert CONTAINER_MEMORY_VAR not in build_plan(_math(trace_volume=True), _env(api_key)).env
    app = build_modal_app(plan)
    monkeypatch.chdir(tmp_path)
    for name, value in plan.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SYNTH_DEPLOY_TASK_APP", str(MATH_DIR / "task_app.py"))
    monkeypatch.setenv("SYNTH_TRACE_VOLUME_DIR", str(tmp_path / "volume"))  # no mount here
    monkeypatch.setenv("ENVIRONMENT_API_KEY", api_key)
    server = serve(web_function(app).local())
    # 128 MiB, unless this machine's cgroup gives less than 512 MiB (then a quarter of that).
    held = pending_limit(container_memory(_env(api_key, **{CONTAINER_MEMORY_VAR: "512"})))
    assert held <= 128 << 20
    health = httpx.get(server.url + "/health", headers={"X-API-Key": api_key}, timeout=5).json()
    assert f"up to {held >> 20} MiB held while copies fail" in health["tracing"]["destination"]
    assert session_log(tmp_path / "traces" / "v3" / "synth_ai.db").limit_bytes == held


@pytest.mark.parametrize(("setting", "files", "memory"), [
    ("512", {}, 512 << 20),                                       # no cgroup to read
    ("512", {"memory.max": "max\n"}, 512 << 20),                  # v2, no limit
    ("512", {"memory.max": f"{256 << 20}\n"}, 256 << 20),         # v2, the lower one
    ("", {"memory.max": f"{1 << 30}\n"}, 1 << 30),                # no setting, v2 limit
    ("", {"memory/memory.limit_in_bytes": "9223372036854771712\n"}, None),  # v1, no limit
    ("", {"memory/memory.limit_in_bytes": f"{300 << 20}\n"}, 300 << 20),
    ("", {}, None),
])
def test_a_containers_memory_is_its_setting_or_its_cgroups_limit(tmp_path, setting, files,
                                                                  memory):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    env = load_env(environ={CONTAINER_MEMORY_VAR: setting} if setting else {})
    assert container_memory(env, cgroup=tmp_path) == memory


def test_the_log_limit_is_a_quarter_of_memory_within_its_bounds():
    assert pending_limit(512 << 20) == 128 << 20
    assert pending_limit(None) == pending_limit(64 << 30) == 256 << 20  # unknown, or plenty
    assert pending_limit(32 << 20) == 16 << 20  # a floor: a log that holds nothing loses all
