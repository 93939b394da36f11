"""Helpers for the train tests: config files, and `synth-deploy train` run in-process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from synth_deploy.cli import app

APP_CONFIGS = Path(__file__).parents[2] / "apps" / "math" / "configs"
FAST = ["--poll-interval", "0.02", "--poll-timeout", "20"]
RL_HEAD = '[algorithm]\ntype = "online"\nmethod = "policy_gradient"\n'


def write(tmp_path, text, name="c.toml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def env_file(work: Path, **values: str) -> str:
    path = work / "test.env"
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return str(path)


def run(*args: str):
    return CliRunner().invoke(app, ["train", *args], catch_exceptions=False)


def sft_workspace(work: Path, lines: int = 5) -> Path:
    shutil.copy(APP_CONFIGS / "sft.toml", work / "sft.toml")
    with (work / "sft_examples.jsonl").open("w") as f:
        for i in range(lines):
            f.write(json.dumps({"messages": [{"role": "user", "content": f"{i}+{i}?"},
                                             {"role": "assistant", "content": str(2 * i)}]})
                    + "\n")
    return work / "sft.toml"
