"""Fixtures of the train tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A clean working directory and a process environment without the kit's keys."""
    for name in ("SYNTH_API_KEY", "ENVIRONMENT_API_KEY", "TASK_APP_URL", "SYNTH_BACKEND_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "400")  # rich wraps at 80 otherwise, splitting file:line
    return tmp_path
