"""`synth-deploy traces ...` in-process with CliRunner, on real files."""

from __future__ import annotations

import json
import subprocess
import sys

from sessions import make_session
from typer.testing import CliRunner

from synth_deploy.cli import app
from synth_deploy.tracing import SCHEMA_VERSION, SessionTracer, open_trace_store
from synth_deploy.train import validate_sft_file

runner = CliRunner()


def run(*args: str, env: dict[str, str] | None = None):
    return runner.invoke(app, ["traces", *args], env=env or {})


def seeded(tmp_path, n: int = 5) -> tuple[str, list]:
    path = str(tmp_path / "t.db")
    sessions = [make_session(i, reward=float(i % 2)) for i in range(n)]
    with open_trace_store(path) as store:
        for s in sessions:
            store.write_session_sync(s)
    return path, sessions


def test_where_init_and_sources(tmp_path):
    db = str(tmp_path / "new" / "t.db")
    result = run("where", "--json", env={"SYNTH_TRACES_DB": db})
    report = json.loads(result.stdout)
    assert result.exit_code == 0 and report["exists"] is False
    assert report["source"] == "SYNTH_TRACES_DB from environment"
    result = run("init", "--trace-db", db)
    said = " ".join(result.stdout.split())  # as wrapped to the terminal's width
    assert result.exit_code == 0 and f"schema v{SCHEMA_VERSION}" in said
    report = json.loads(run("where", "--json", "--trace-db", db).stdout)
    assert report["exists"] and report["schema_version"] == SCHEMA_VERSION
    assert report["source"] == "--trace-db"


def test_ls_show_stats(tmp_path):
    db, sessions = seeded(tmp_path)
    rows = json.loads(run("ls", "--json", "--trace-db", db, "--limit", "3").stdout)
    assert len(rows) == 3 and rows[0]["app_id"] == "math"
    human = run("ls", "--trace-db", db)
    assert human.exit_code == 0 and sessions[0].session_id[:16] in human.stdout
    # The 16 characters `ls` shows (ids are time-ordered: 11 of them are the millisecond)
    shown = run("show", sessions[2].session_id[:16], "--json", "--trace-db", db)
    assert json.loads(shown.stdout)["session_id"] == sessions[2].session_id
    text = run("show", sessions[2].session_id, "--trace-db", db).stdout
    assert "Answer: 3" in text and "outcome reward" in text
    stats = json.loads(run("stats", "--json", "--trace-db", db).stdout)
    assert stats["sessions"] == 5 and stats["lm_calls"] == 10
    missing = run("show", "nope", "--trace-db", db)
    # A bad value, as the README's exit codes say: 2.
    assert missing.exit_code == 2 and "no session" in missing.stderr


def test_export_writes_valid_sft_and_refuses_to_overwrite(tmp_path):
    db, _ = seeded(tmp_path, n=6)
    out = tmp_path / "sft.jsonl"
    result = run("export", "--format", "sft", "--out", str(out), "--min-reward", "1",
                 "--trace-db", db, "--json")
    assert result.exit_code == 0, result.stdout + result.stderr
    summary = json.loads(result.stdout)
    check = validate_sft_file(out)
    assert check.ok and check.count == summary["examples"] == 3 * 2  # 3 winners × 2 turns
    again = run("export", "--out", str(out), "--trace-db", db)
    assert again.exit_code == 2 and "already exists" in again.stderr
    assert run("export", "--format", "csv", "--out", str(tmp_path / "x"),
               "--trace-db", db).exit_code == 2
    bad_since = run("export", "--out", str(tmp_path / "y"), "--since", "soon", "--trace-db", db)
    assert bad_since.exit_code == 2 and "--since" in bad_since.stderr


def test_unknown_format_is_a_json_usage_error(tmp_path):
    db, _ = seeded(tmp_path, n=1)
    result = run("export", "--format", "csv", "--out", str(tmp_path / "x"), "--trace-db", db,
                 "--json")
    assert result.exit_code == 2
    error = json.loads(result.stdout)["error"]
    assert error["type"] == "UsageError" and "csv" in error["message"]
    assert "sft" in error["hint"] and not (tmp_path / "x").exists()


def test_stored_text_is_printed_literally_not_as_markup(tmp_path):
    # "[/INST]" closes a tag that was never opened (rich raises MarkupError) and "arr[i]",
    # "[bold]" look like tags rich would silently drop.
    db = str(tmp_path / "runs[/old]" / "t.db")
    prompt = "<s>[INST] sum arr[i] for [bold]i[/bold] [/INST]"
    tracer = SessionTracer(metadata={"app_id": "app[/x]", "model": "llama[/INST]",
                                     "status": "ok", "error": {"message": "bad [/red] out"}})
    tracer.start_timestep("turn[/1]", turn_number=1)
    tracer.record_message("user", prompt)
    tracer.record_lm_call(model_name="llama[/INST]", input_tokens=3, output_tokens=2)
    tracer.record_message("assistant", "[/INST] 42")
    tracer.record_environment_event(reward=1.0, terminated=True)
    tracer.record_outcome_reward(1.0)
    session = tracer.finish()
    with open_trace_store(db) as store:
        store.write_session_sync(session)
    env = {"COLUMNS": "200"}
    shown = run("show", session.session_id, "--trace-db", db, env=env)
    assert shown.exit_code == 0, shown.stderr or repr(shown.exception)
    for text in (prompt, "[/INST] 42", "turn[/1]", "lm call llama[/INST]", "bad [/red] out"):
        assert text in shown.stdout, text
    listed = run("ls", "--trace-db", db, env=env)
    assert listed.exit_code == 0, repr(listed.exception)
    assert "runs[/old]" in listed.stdout and "app[/x]" in listed.stdout
    assert "llama[/INST]" in listed.stdout
    stats = run("stats", "--trace-db", db, env=env)
    assert stats.exit_code == 0, repr(stats.exception)
    assert "runs[/old]" in stats.stdout and "app app[/x]" in stats.stdout
    where = run("where", "--trace-db", db, env=env)
    assert where.exit_code == 0 and "runs[/old]" in where.stdout


TITLE, CLEAR, LINK = "\x1b]0;pwned\x07", "\x1b[2J\x1b[H", "\x1b]8;;http://evil.example\x1b\\"


def test_stored_escape_sequences_never_reach_the_terminal(tmp_path):
    # A run id, a model name, a reply: whoever wrote the trace chose them (issue 38).
    db = str(tmp_path / "t.db")
    tracer = SessionTracer(metadata={"app_id": "math", "run_id": f"run{TITLE}",
                                     "model": f"m{CLEAR}", "status": "error",
                                     "error": {"message": f"failed{LINK}here"}})
    tracer.start_timestep(f"turn{CLEAR}", turn_number=1)
    tracer.record_message("user", f"hi{TITLE}")
    tracer.record_lm_call(model_name=f"m{CLEAR}", input_tokens=3, output_tokens=2)
    tracer.record_message("assistant", f"{LINK}click\x9b31m\x1b\\")
    session = tracer.finish()
    with open_trace_store(db) as store:
        store.write_session_sync(session)
    env = {"COLUMNS": "200"}
    for args in (("show", session.session_id), ("ls",), ("stats",)):
        result = run(*args, "--trace-db", db, env=env)
        assert result.exit_code == 0, repr(result.exception)
        assert not {"\x1b", "\x07", "\x9b"} & set(result.output), (args, result.output)
    shown = run("show", session.session_id, "--trace-db", db, env=env).stdout
    assert "run\\x1b]0;pwned\\x07" in shown  # shown as what it is, the bell included


def test_bad_inputs_exit_with_clear_errors(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_text("not sqlite")
    result = run("ls", "--trace-db", str(junk))
    assert result.exit_code == 1 and "not a SQLite database" in result.stderr
    assert junk.read_text() == "not sqlite"
    result = run("where", "--trace-db", "mysql://h/db")
    assert result.exit_code == 2 and "unsupported" in result.stderr
    result = run("ls", "--trace-db", str(tmp_path / "absent.db"))
    assert result.exit_code == 1 and "traces init" in result.stderr


def test_cli_start_up_stays_light():
    code = ("import sys; from synth_deploy.cli import app; "
            "print(sorted(m for m in ('libsql', 'sqlite3') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "[]", out.stderr
