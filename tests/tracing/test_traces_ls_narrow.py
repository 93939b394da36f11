"""`traces ls` for a first-time user (issue 14): readable at 80 columns, and a title that tells
the rows shown from the sessions stored."""

from __future__ import annotations

from sessions import make_session
from typer.testing import CliRunner

from synth_deploy.cli import app
from synth_deploy.tracing import open_trace_store

MODEL = "Qwen/Qwen3-4B-Instruct-2507"


def ls(db: str, *args: str, columns: int = 80):
    result = CliRunner().invoke(app, ["traces", "ls", "--trace-db", db, *args],
                                env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.stdout


def stored(tmp_path, n: int = 42, errors: int = 2, models: tuple[str, ...] = (MODEL,)) -> str:
    db = str(tmp_path / "t.db")
    with open_trace_store(db) as store:
        for i in range(n):
            store.write_session_sync(make_session(
                i, model=models[i % len(models)], status="error" if i < errors else "ok"))
    return db


def title(out: str) -> str:
    """The table's title, rejoined if the terminal wrapped it."""
    return " ".join(out.split("session  ")[0].split("every one shown:")[0].split())


def test_the_title_tells_shown_rows_from_stored_sessions(tmp_path):
    db = stored(tmp_path)
    assert title(ls(db)).startswith("newest 20 of 42 sessions in ")
    assert title(ls(db)).endswith(" (--limit N shows more)")
    assert title(ls(db, "--limit", "50")).startswith("42 session(s) in ")
    assert title(ls(db, "--status", "error")).startswith("2 session(s) in ")
    assert title(ls(db, "--status", "ok", "-n", "5")).startswith("newest 5 of 40 sessions in ")


def header_and_rows(out: str) -> tuple[str, list[str]]:
    lines = out.splitlines()
    [header] = [line for line in lines if line.startswith("session ")]
    return header, lines[lines.index(header) + 2:]


def test_an_app_and_model_every_row_shares_are_said_once_above_the_table(tmp_path):
    db = stored(tmp_path, n=3, errors=0)
    for columns in (80, 60):
        out = ls(db, columns=columns)
        assert "…" not in out
        assert max(len(line.rstrip()) for line in out.splitlines()) <= columns
        assert "every one shown: app math" in out and f"model {MODEL}" in out
        header, rows = header_and_rows(out)
        assert len(rows) == 3  # no row folds onto a second line
        assert header.split()[:5] == ["session", "created", "(UTC)", "seed", "status"]
        # Ids whole (what `traces show` takes), times to the second: nothing cut.
        for row in rows:
            session, day, time = row.split()[:3]
            assert len(session) == 16 and len(day) == 5 and len(time) == 8, row


def test_every_column_shown_is_whole_when_rows_differ(tmp_path):
    db = stored(tmp_path, n=4, errors=0, models=(MODEL, "gpt-4o-mini"))
    out = ls(db)
    assert "…" not in out and "every one shown: app math\n" in out
    lines = out.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    header, rows = header_and_rows(out)
    assert header.split() == ["session", "created", "(UTC)", "seed", "model", "status",
                              "reward"]
    # A model name folds onto the next lines of its cell rather than losing its end (a row
    # runs until the next one starts with its session id).
    column, cells = header.index("model"), []
    for line in rows:
        part = line[column:].split()[0] if line[column:].strip() else ""
        if line[:1].strip():
            cells.append(part)
        else:
            cells[-1] += part
    assert set(cells) == {MODEL, "gpt-4o-mini"}
    # At 60 columns the time goes before an id or a model is cut.
    narrow = ls(db, columns=60)
    assert "…" not in narrow
    assert max(len(line.rstrip()) for line in narrow.splitlines()) <= 60
    header, rows = header_and_rows(narrow)
    assert header.split() == ["session", "seed", "model", "status", "reward"]
    assert all(len(row.split()[0]) == 16 for row in rows if row[:1].strip())
    wide = ls(db, columns=160)
    assert MODEL in wide and all(h in wide for h in ("steps", "events", "msgs"))
