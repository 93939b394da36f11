"""`traces ls` for a first-time user (issue 14): readable at 80 columns, and a title that tells
the rows shown from the sessions stored."""

from __future__ import annotations

from test_tracing_store import make_session
from typer.testing import CliRunner

from synth_deploy.cli import app
from synth_deploy.tracing import open_trace_store

MODEL = "Qwen/Qwen3-4B-Instruct-2507"


def ls(db: str, *args: str, columns: int = 80):
    result = CliRunner().invoke(app, ["traces", "ls", "--trace-db", db, *args],
                                env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.stdout


def stored(tmp_path, n: int = 42, errors: int = 2) -> str:
    db = str(tmp_path / "t.db")
    with open_trace_store(db) as store:
        for i in range(n):
            store.write_session_sync(make_session(
                i, model=MODEL, status="error" if i < errors else "ok"))
    return db


def title(out: str) -> str:
    """The table's title, rejoined if the terminal wrapped it."""
    return " ".join(out.split("session  ")[0].split())


def test_the_title_tells_shown_rows_from_stored_sessions(tmp_path):
    db = stored(tmp_path)
    assert title(ls(db)).startswith("newest 20 of 42 sessions in ")
    assert title(ls(db)).endswith(" (--limit N shows more)")
    assert title(ls(db, "--limit", "50")).startswith("42 session(s) in ")
    assert title(ls(db, "--status", "error")).startswith("2 session(s) in ")
    assert title(ls(db, "--status", "ok", "-n", "5")).startswith("newest 5 of 40 sessions in ")


def test_every_column_shown_is_whole_at_80_columns(tmp_path):
    db = stored(tmp_path, n=3, errors=0)
    out = ls(db)
    assert "…" not in out
    lines = out.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    [header] = [line for line in lines if "session" in line and "created (UTC)" in line]
    assert header.split() == ["session", "created", "(UTC)", "app", "seed", "model", "status",
                              "reward"]
    # The model name folds onto the next lines of its cell rather than losing its end (the
    # first row runs until the next one starts with its session id).
    start = lines.index(header) + 2
    end = next((i for i in range(start + 1, len(lines)) if lines[i][:1].strip()), len(lines))
    first_row = lines[start:end]
    column = header.index("model")
    assert "".join(line[column:].split()[0] for line in first_row
                   if line[column:].strip()).startswith(MODEL)
    wide = ls(db, columns=160)
    assert MODEL in wide and all(h in wide for h in ("steps", "events", "msgs"))
