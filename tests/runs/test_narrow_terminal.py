"""`smoke` and `eval` at 80 columns (issue 14): every header whole, and a failed rollout's
cause printed in full below the table, never cut to fit a cell."""

from __future__ import annotations

import pytest
from processes import run_cli

CAUSE = ("the environment's reward table is missing row 42 of /data/tables/rewards.parquet; "
         "rebuild it with `make tables` and retry")
FAILING_APP = f'''
from synth_deploy.taskapp import TaskApp

task_app = TaskApp("boom", name="Boom", description="Fails on odd seeds.")


@task_app.rollout
async def rollout(request, ctx):
    if request.env.seed % 2:
        raise RuntimeError({CAUSE!r})
    ctx.tracer.record_outcome_reward(1.0)
'''
HEADERS = ("seed", "status", "reward", "latency s", "details")


@pytest.fixture
def failing_app(tmp_path):
    (tmp_path / "apps" / "boom").mkdir(parents=True)
    (tmp_path / "apps" / "boom" / "task_app.py").write_text(FAILING_APP)
    return tmp_path


@pytest.mark.parametrize("command", ["smoke", "eval"])
def test_failed_rollouts_print_their_whole_cause_at_80_columns(failing_app, command):
    result = run_cli(failing_app, command, "boom", "--seeds", "0-3", "--no-trace",
                     COLUMNS="80")
    assert result.returncode == 1, result.stderr
    out = result.stdout
    assert "…" not in out
    for header in HEADERS:
        assert header in out
    assert "2 failed rollouts:" in out
    lines = out.splitlines()
    for seed in (1, 3):
        [line] = [line for line in lines if line.startswith(f"  seed {seed} (")]
        assert line.endswith(f"RuntimeError: {CAUSE}")  # on one line, whole
    # The table itself fits the terminal.
    table = lines[lines.index(next(x for x in lines if "latency s" in x)):]
    table = table[:next(i for i, x in enumerate(table) if "failed rollout" in x)]
    assert max(len(x) for x in table) <= 80


def test_a_narrow_terminal_drops_low_value_columns_before_cutting_any(failing_app):
    result = run_cli(failing_app, "smoke", "boom", "--seeds", "0-1", "--no-trace",
                     COLUMNS="56")
    out = result.stdout
    assert "…" not in out
    for header in HEADERS:
        assert header in out
    [header_line] = [line for line in out.splitlines() if "latency s" in line]
    assert "outcome" not in header_line and "events" not in header_line  # dropped first
    assert f"RuntimeError: {CAUSE}" in out


def test_the_summary_counts_in_words_says_what_the_mean_leaves_out_and_fits(failing_app):
    result = run_cli(failing_app, "smoke", "boom", "--seeds", "0-2", "--no-trace",
                     COLUMNS="80")
    assert result.returncode == 1, result.stderr
    out = result.stdout
    assert "1 failed rollout:" in out and "1 errors" not in out
    summary = out[out.index("3 rollouts (rl), 1 error · "):]
    # Seed 1 failed: the mean is of seeds 0 and 2, and the line says so.
    assert "mean reward 1.000 over 2 ok (1 failed left out)" in summary
    assert all(len(line) <= 80 for line in summary.splitlines()), summary
    one = run_cli(failing_app, "smoke", "boom", "--seeds", "0", "--no-trace", COLUMNS="80")
    assert "1 rollout (rl), 0 errors · mean reward 1.000 · " in one.stdout
