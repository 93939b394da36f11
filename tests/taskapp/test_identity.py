"""An app's identity: its declared version and the digest of its code, said by /health and
/info and stored with every session; `traces ls` tells two versions' sessions apart."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest
from processes import clean_env, free_port, refused_in_process, wait_until_up

from synth_deploy.errors import TaskAppError
from synth_deploy.taskapp.registry import AppIdentity, app_identity, load_app

APP = '''
from synth_deploy.taskapp import TaskApp

task_app = TaskApp("versioned", name="Versioned", description="Says its reward.",
                   version={version!r}{extra})


@task_app.rollout
async def rollout(request, ctx):
    ctx.tracer.record_outcome_reward({reward})
'''

# A served app in its own process, by file: python -c SERVER APP_FILE TRACE_DB KEY PORT
SERVER = """
import sys
from synth_deploy.env import Env
from synth_deploy.serving import LocalRunner, ServeSettings, ServerKeys
from synth_deploy.tracing import parse_trace_db
LocalRunner(ServeSettings(app=sys.argv[1], env=Env(), keys=ServerKeys((sys.argv[3],), "argv"),
                          traces=parse_trace_db(sys.argv[2]), port=int(sys.argv[4]),
                          log_level="warning")).serve_forever()
"""


def write_app(folder: Path, *, version: str = "1", reward: float = 1.0, extra: str = "",
              name: str = "task_app.py") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    # Written twice within a second at the same size, as an edit may be: what is served
    # is still the file's newest text (the kit keeps no bytecode cache of app files).
    path.write_text(textwrap.dedent(APP.format(version=version, reward=reward, extra=extra)))
    return path


def identity_of(path: Path):
    return app_identity(path, version="1")


def test_the_digest_follows_the_code_and_nothing_else(tmp_path):
    a = write_app(tmp_path / "a")
    b = write_app(tmp_path / "b")
    first = app_identity(a, version="1")
    assert isinstance(first, AppIdentity) and len(first.digest) == 16
    assert app_identity(b, version="1").digest == first.digest  # same code, another place
    assert first.files == ("task_app.py",)
    # A sibling module is the app's code (it may import it); a data file is not, unless it
    # is declared; files below the folder are not either.
    (tmp_path / "a" / "rules.py").write_text("LIMIT = 3\n")
    with_sibling = app_identity(a, version="1")
    assert with_sibling.digest != first.digest and with_sibling.files == ("rules.py",
                                                                          "task_app.py")
    (tmp_path / "a" / "notes.txt").write_text("a note")
    (tmp_path / "a" / "sub").mkdir()
    (tmp_path / "a" / "sub" / "deep.py").write_text("x = 1\n")
    assert app_identity(a, version="1").digest == with_sibling.digest
    declared = app_identity(a, version="1", code_files=("notes.txt", "sub/"))
    assert declared.files == ("notes.txt", "rules.py", "sub/deep.py", "task_app.py")
    (tmp_path / "a" / "notes.txt").write_text("another note")
    assert app_identity(a, version="1", code_files=("notes.txt", "sub/")).digest \
        != declared.digest
    # The version is declared, not hashed: the label says both.
    assert app_identity(a, version="2").digest == with_sibling.digest
    assert app_identity(a, version="2").label == f"2+{with_sibling.digest}"


def test_a_declared_file_that_matches_nothing_is_named(tmp_path):
    path = write_app(tmp_path / "app")
    with pytest.raises(TaskAppError) as err:
        app_identity(path, version="1", code_files=("prompts/*.txt",))
    assert "prompts/*.txt" in err.value.message and "relative to the app's folder" in \
        err.value.hint


def test_a_loaded_app_carries_its_identity_into_health_and_info(tmp_path, serve, api_key):
    from synth_deploy.serving import create_app

    path = write_app(tmp_path / "served", version="7", extra=', code_files=("notes.txt",)')
    (tmp_path / "served" / "notes.txt").write_text("prompt v1")
    config = load_app(str(path)).build_config()
    assert config.identity.version == "7" and config.identity.files == ("notes.txt",
                                                                        "task_app.py")
    server = serve(create_app(config, api_keys=[api_key]))
    headers = {"X-API-Key": api_key}
    health = httpx.get(server.url + "/health", headers=headers, timeout=10).json()
    info = httpx.get(server.url + "/info", headers=headers, timeout=10).json()
    metadata = httpx.get(server.url + "/containers/metadata", headers=headers,
                         timeout=10).json()  # synth-containers' contract says it too
    assert health["identity"] == info["service"]["identity"] == config.identity.to_dict() \
        == metadata["runtime"]["identity"]
    assert health["identity"]["digest"] == config.identity.digest


def test_the_bundled_math_app_has_one_identity_in_check_and_the_deploy_plan(math_server,
                                                                           api_key):
    from synth_deploy.env import Env
    from synth_deploy.health import CheckOptions, check
    from synth_deploy.modal import build_plan

    entry = load_app("math")
    expected = entry.build_config().identity
    assert expected.files == ("math_problems.py", "task_app.py")
    report = check(math_server.url, api_key, CheckOptions(seeds=(0,)))
    assert report.identity == {"version": expected.version, "digest": expected.digest,
                               "label": expected.label}
    assert report.to_dict()["identity"]["digest"] == expected.digest
    assert expected.digest in report.identity_line()
    plan = build_plan(entry, Env({"ENVIRONMENT_API_KEY": api_key}))
    assert plan.to_dict()["identity"]["digest"] == expected.digest


def serve_into(store: Path, app: Path, key: str, seeds: range) -> None:
    """Serve ``app`` in a child process tracing into ``store``, play ``seeds``, stop it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(app), str(store), key,
                             str(port)], env=clean_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_until_up(url, proc)
        for seed in seeds:
            body = {"run_id": f"run-{seed}", "env": {"seed": seed}, "mode": "eval",
                    "policy": {"config": {"model": "m"}}}
            resp = httpx.post(url + "/rollout", json=body, headers={"X-API-Key": key},
                              timeout=30)
            assert resp.status_code == 200, resp.text
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_two_versions_served_one_after_the_other_are_told_apart(tmp_path, api_key, serve):
    store = tmp_path / "traces.db"
    app = write_app(tmp_path / "app", reward=1.0)
    first = identity_of(app)
    serve_into(store, app, api_key, range(0, 3))
    write_app(tmp_path / "app", reward=0.0)  # the reward changed; the version did not
    second = identity_of(app)
    assert first.digest != second.digest
    serve_into(store, app, api_key, range(3, 5))

    listed = refused_in_process(tmp_path, "traces", "ls", "--trace-db", str(store), "--json")
    assert listed.exit_code == 0, listed.output
    by_digest: dict[str, set[str]] = {}
    for row in json.loads(listed.stdout):
        assert row["app_version"] == "1"
        by_digest.setdefault(row["app_digest"], set()).add(row["run_id"])
    assert by_digest == {first.digest: {"run-0", "run-1", "run-2"},
                         second.digest: {"run-3", "run-4"}}

    grouped = refused_in_process(tmp_path, "traces", "ls", "--trace-db", str(store),
                                 "--group", "identity", "--json")
    assert grouped.exit_code == 0, grouped.output
    groups = {g["app_digest"]: g for g in json.loads(grouped.stdout)}
    assert {d: (g["sessions"], g["mean_reward"]) for d, g in groups.items()} == {
        first.digest: (3, 1.0), second.digest: (2, 0.0)}
    assert list(groups) == [second.digest, first.digest]  # the newest code first

    only = refused_in_process(tmp_path, "traces", "ls", "--trace-db", str(store), "--json",
                              "--app-digest", first.digest[:8])
    assert {r["run_id"] for r in json.loads(only.stdout)} == {"run-0", "run-1", "run-2"}
    table = refused_in_process(tmp_path, "traces", "ls", "--trace-db", str(store))
    assert f"v1 {first.digest[:8]}" in table.stdout and f"v1 {second.digest[:8]}" in \
        table.stdout
    bad = refused_in_process(tmp_path, "traces", "ls", "--trace-db", str(store),
                             "--app-digest", "not-hex")
    assert bad.exit_code == 2 and "hex digits" in bad.output

    # The viewer filters by the same rule and says which code made each session.
    from synth_deploy.tracing import open_trace_store
    from synth_deploy.viewer import create_viewer_app

    with open_trace_store(str(store), read_only=True) as opened:
        viewer = serve(create_viewer_app(opened))
        page = httpx.get(viewer.url + "/api/sessions", timeout=30,
                         params={"app_digest": second.digest[:6]}).json()
        assert {r["run_id"]: r["app_digest"] for r in page["rows"]} == {
            "run-3": second.digest, "run-4": second.digest}
        one = httpx.get(viewer.url + f"/api/sessions/{page['rows'][0]['session_id']}",
                        timeout=30).json()
        assert (one["app_version"], one["app_digest"]) == ("1", second.digest)
        summary = httpx.get(viewer.url + "/api/summary", timeout=30).json()
        assert [(g["app_digest"], g["sessions"]) for g in summary["identities"]] == [
            (second.digest, 2), (first.digest, 3)]
