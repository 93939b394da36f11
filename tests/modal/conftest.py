"""Fixtures of the Modal tests: nothing here can reach Modal's servers."""

from __future__ import annotations

import os

import pytest
from standins.modal_api import ModalAPIStandin
from standins.modal_helpers import stop_containers


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """cwd with a .env, fake credentials (never valid anywhere), the stand-in's state dir;
    stops every "container" the stand-in started, by pid."""
    state = tmp_path / "modal-state"
    state.mkdir()
    key = "sk_env_deploytest_" + os.urandom(8).hex()
    (tmp_path / ".env").write_text(f"ENVIRONMENT_API_KEY={key}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-standin")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-standin")
    api = ModalAPIStandin("up")
    monkeypatch.setenv("MODAL_SERVER_URL", api.url)
    monkeypatch.setenv("STANDIN_MODAL_STATE_DIR", str(state))
    monkeypatch.delenv("STANDIN_MODAL_MODE", raising=False)
    monkeypatch.delenv("ENVIRONMENT_API_KEY", raising=False)
    monkeypatch.delenv("SYNTH_TRACES_DB", raising=False)
    yield {"key": key, "state": state, "dir": tmp_path}
    api.close()
    stop_containers(state)
