"""Discovery never drops an app file in silence (issue 14): a file it cannot read is reported
with file:line and the error, by `apps` and by `serve`/`smoke` of the app it would declare."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from processes import refused_in_process, run_cli

from synth_deploy.errors import AppNotFoundError
from synth_deploy.taskapp.registry import AppFileProblem, load_app, scan_apps

GOOD_APP = '''
from synth_deploy.taskapp import TaskApp

task_app = TaskApp("good", name="Good", description="Loads fine.")


@task_app.rollout
async def rollout(request, ctx):
    ctx.tracer.record_outcome_reward(1.0)
'''
BROKEN_APP = '''
from synth_deploy.taskapp import TaskApp

task_app = TaskApp("broken", name="Broken", description="An unclosed ( on line 6.")

def rollout(request, ctx:
    return None
'''


@pytest.fixture
def apps_dir(tmp_path):
    for name, text in (("good", GOOD_APP), ("broken", BROKEN_APP)):
        (tmp_path / "apps" / name).mkdir(parents=True)
        (tmp_path / "apps" / name / "task_app.py").write_text(text)
    (tmp_path / "apps" / "latin1").mkdir()
    (tmp_path / "apps" / "latin1" / "task_app.py").write_bytes(b"# caf\xe9\n")
    return tmp_path


def test_scan_reports_each_unreadable_file_with_where_and_why(apps_dir):
    scan = scan_apps([apps_dir / "apps"])
    assert [a.app_id for a in scan.apps] == ["good"]
    by_folder = {p.path.parent.name: p for p in scan.problems}
    assert set(by_folder) == {"broken", "latin1"}
    broken = by_folder["broken"]
    assert (broken.line, broken.column) == (6, 12)
    assert broken.error.startswith("SyntaxError: ")
    assert str(broken).startswith(f"{apps_dir / 'apps' / 'broken' / 'task_app.py'}:6:12: ")
    assert "not UTF-8" in by_folder["latin1"].error
    assert isinstance(broken, AppFileProblem) and broken.to_dict()["line"] == 6


def test_loading_an_id_names_the_files_that_could_not_be_read(apps_dir):
    with pytest.raises(AppNotFoundError) as caught:
        load_app("broken", [apps_dir / "apps"])
    message = caught.value.message
    assert message.startswith("no task app with id 'broken'; 2 app file(s) could not be read")
    assert f"{apps_dir / 'apps' / 'broken' / 'task_app.py'}:6:12: SyntaxError" in message
    assert caught.value.hint.startswith("fix the file(s) above")


def test_apps_lists_what_it_found_and_what_it_could_not_read(apps_dir):
    result = run_cli(apps_dir, "apps", COLUMNS="80")
    assert result.returncode == 1
    assert "good" in result.stdout and "math" in result.stdout
    assert "2 app file(s) could not be read" in result.stderr
    assert f"{apps_dir / 'apps' / 'broken' / 'task_app.py'}:6:12: SyntaxError" in result.stderr
    as_json = run_cli(apps_dir, "apps", "--json")
    assert as_json.returncode == 1
    document = json.loads(as_json.stdout)
    assert {a["app_id"] for a in document["apps"]} >= {"good", "math"}
    # The files it could not read are in the document, not only on stderr.
    problems = {Path(p["path"]).parent.name: p for p in document["problems"]}
    assert set(problems) == {"broken", "latin1"}
    assert problems["broken"] == {"path": str(apps_dir / "apps" / "broken" / "task_app.py"),
                                  "line": 6, "column": 12,
                                  "error": "SyntaxError: '(' was never closed"}
    assert "not UTF-8" in problems["latin1"]["error"]


def test_serve_and_smoke_of_the_broken_app_say_why_it_is_missing(apps_dir, api_key):
    # By id or by file path: the same file:line, the same exit code (2: a file to fix);
    # refused before anything is served, so asked in this process.
    path = "apps/broken/task_app.py"
    for args in (("serve", "broken"), ("smoke", "broken", "--no-trace"), ("serve", path),
                 ("smoke", path, "--no-trace"), ("eval", path, "--seeds", "0", "--no-trace")):
        result = refused_in_process(apps_dir, *args, ENVIRONMENT_API_KEY=api_key)
        assert result.exit_code == 2 and isinstance(result.exception, SystemExit), \
            result.output
        assert "no task app with id 'broken'" in result.stderr or args[1] == path
        assert f"{apps_dir / 'apps' / 'broken' / 'task_app.py'}:6:12: SyntaxError" \
            in result.stderr


def test_apps_table_keeps_long_paths_whole_at_80_columns(tmp_path):
    deep = tmp_path / "apps" / ("a-rather-long-folder-name-for-an-app-" * 2 + "x")
    deep.mkdir(parents=True)
    (deep / "task_app.py").write_text(GOOD_APP)
    result = run_cli(tmp_path, "apps", COLUMNS="80")
    assert result.returncode == 0, result.stderr
    assert "…" not in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
    cells = "".join(line.split("│")[3].strip() for line in result.stdout.splitlines()
                    if line.count("│") == 4)
    assert str(deep / "task_app.py") in cells
