"""The README's task app example works as printed: it serves, and scores with the mock."""

from __future__ import annotations

import json
import re
from pathlib import Path

from processes import run_cli

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example() -> str:
    section = README.read_text().split("## Writing a task app", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_writing_a_task_app_example_scores_above_zero_with_the_mock(tmp_path):
    (tmp_path / "tiny.py").write_text(readme_example())
    result = run_cli(tmp_path, "smoke", "tiny.py", "--seeds", "0-9", "--json", "--no-trace",
                     timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(result.stdout)["summary"]
    assert summary["errors"] == 0 and summary["mean_reward"] > 0.5, summary
    assert summary["mean_outcome_score"] == summary["mean_reward"]  # filled in by the kit


def test_the_example_lists_without_being_imported(tmp_path):
    (tmp_path / "apps" / "tiny").mkdir(parents=True)
    (tmp_path / "apps" / "tiny" / "tiny.py").write_text(readme_example())
    result = run_cli(tmp_path, "apps", "--json")
    apps = {a["app_id"]: a for a in json.loads(result.stdout)["apps"]}
    assert apps["tiny"]["description"] == "Add two numbers."
