"""Traces that outlive the container: a deployed app records into its trace Volume, and
`traces pull` brings every committed session home.

Modal is played by the stand-ins (tests/standins/modal_cli.py starts the "containers",
modal_volume.py plays the Volume: per-container views, visible only after a commit,
background and shutdown commits, last writer wins); the app, uvicorn, SQLite and the CLI
are the real ones.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sqlite3
import time
from pathlib import Path

import httpx
import pytest
from rollouts import fire, rollout_body
from standins.modal_helpers import COMMAND as STANDIN
from typer.testing import CliRunner

from synth_deploy.cli import app as cli_app
from synth_deploy.env import Env
from synth_deploy.serving import LocalRunner, ServerKeys, ServeSettings
from synth_deploy.tracing import parse_trace_db, read_session_log

ROOT = Path(__file__).resolve().parents[2]
COMMIT_S = 1.5
PER_CONTAINER = 100


def _math_app(folder: Path, **settings: str) -> Path:
    """The math app, copied with extra ModalSettings (the trace commit interval...)."""
    shutil.copytree(ROOT / "apps" / "math", folder, ignore=shutil.ignore_patterns("__pycache__"))
    source = folder / "task_app.py"
    extra = "".join(f"{k}={v}, " for k, v in settings.items())
    text = source.read_text().replace('name="synth-math",', f'name="synth-mathvol", {extra}')
    # An app id of its own: the registry may hold apps/math already.
    source.write_text(text.replace('task_app = TaskApp(\n    "math",',
                                   'task_app = TaskApp(\n    "mathvol",', 1))
    return source


def _cli(*args: str):
    return CliRunner().invoke(cli_app, [*args, "--modal-cli", STANDIN], catch_exceptions=False)


def _committed_sessions(state: Path, task_id: str) -> int:
    """The sessions the container's committed files hold: its log's records, and rows."""
    ids: set[str] = set()
    folder = state / "volumes" / "synth-mathvol-traces" / "synth-mathvol"
    for path in folder.glob(f"{task_id}.*.log"):
        ids |= {session_id for session_id, _, _ in read_session_log(path).records}
    for path in folder.glob(f"{task_id}.*.db"):
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
            ids |= {row[0] for row in conn.execute("SELECT session_id FROM session_traces")}
    return len(ids)


def _run_ids(db: Path) -> set[str]:
    with sqlite3.connect(db) as conn:
        return {json.loads(m)["run_id"] for (m,) in conn.execute(
            "SELECT metadata FROM session_traces")}


def _sft(db: Path, out: Path) -> list[dict]:
    result = CliRunner().invoke(cli_app, ["traces", "export", "--format", "sft", "--out",
                                          str(out), "--trace-db", str(db), "--json"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    for line in lines:
        line["metadata"].pop("session_id")  # each store names its sessions
        for timing in ("lm_s", "env_s", "wall_s"):  # measured, so never the same twice
            line["metadata"]["ledger"].pop(timing)
    return sorted(lines, key=lambda x: json.dumps(x, sort_keys=True))


@pytest.mark.slow
def test_three_containers_one_killed_pull_holds_every_committed_session(
        standin, mock_policy, monkeypatch, tmp_path):
    state = standin["state"]
    monkeypatch.setenv("STANDIN_MODAL_CONTAINERS", "3")
    monkeypatch.setenv("STANDIN_VOLUME_BACKGROUND_S", "30")  # ours commit well before Modal's
    app_file = _math_app(tmp_path / "mathvol", trace_commit_s=str(COMMIT_S))

    plan = _cli("deploy", str(app_file), "--dry-run", "--json")
    assert plan.exit_code == 0, plan.output
    assert json.loads(plan.stdout)["plan"]["trace_volume"] == "synth-mathvol-traces"
    deployed = _cli("deploy", str(app_file), "--no-check")
    assert deployed.exit_code == 0, deployed.output
    assert "traces go to the Modal Volume synth-mathvol-traces" in deployed.output
    containers = [json.loads(line) for line in (state / "containers.jsonl").read_text()
                  .splitlines()]
    assert len(containers) == 3
    key, inference = standin["key"], mock_policy.url + "/v1"

    def send(container: dict, first: int, count: int) -> set[str]:
        bodies = [rollout_body(f"{container['task_id']}-{i}", i, inference)
                  for i in range(first, first + count)]
        answered = asyncio.run(fire(container["url"], key, bodies, concurrency=8))
        assert [status for _, status in answered] == [200] * count
        return {run_id for run_id, _ in answered}

    answered = {c["task_id"]: send(c, 0, PER_CONTAINER) for c in containers}
    killed = containers[0]
    # Its first 100 are committed (within an interval or two), then 20 more are answered...
    deadline = time.monotonic() + 30
    while _committed_sessions(state, killed["task_id"]) < PER_CONTAINER:
        assert time.monotonic() < deadline, "the killed container never committed"
        time.sleep(0.2)
    late = send(killed, PER_CONTAINER, 20)
    answered[killed["task_id"]] |= late
    health = httpx.get(killed["url"] + "/health", headers={"X-API-Key": key}, timeout=5).json()
    assert health["tracing"]["sessions"] == PER_CONTAINER + 20
    assert "Modal Volume synth-mathvol-traces" in health["tracing"]["destination"]
    assert health["tracing"]["durable"] is True
    # ...and it dies with SIGKILL, between commits; the others drain (SIGTERM).
    os.kill(killed["pid"], signal.SIGKILL)
    for survivor in containers[1:]:
        os.kill(survivor["pid"], signal.SIGTERM)
    for c in containers:
        _wait_gone(c["pid"])

    home = tmp_path / "home.db"
    pulled = _cli("traces", "pull", "synth-mathvol", "--trace-db", str(home), "--json")
    assert pulled.exit_code == 0, pulled.output
    report = json.loads(pulled.stdout)
    per_container = {c["container"]: c["added"] for c in report["containers"]}
    assert len(per_container) == 3 and report["files"] >= 3
    assert report["sessions_added"] == sum(per_container.values())
    have = _run_ids(home)
    for survivor in containers[1:]:
        assert per_container[survivor["task_id"]] == PER_CONTAINER
        assert answered[survivor["task_id"]] <= have
    from_killed = {r for r in have if r.startswith(killed["task_id"])}
    assert answered[killed["task_id"]] - late <= from_killed <= answered[killed["task_id"]]
    assert per_container[killed["task_id"]] == len(from_killed)
    assert len(answered[killed["task_id"]] - from_killed) <= len(late)  # one interval's worth

    again = _cli("traces", "pull", "synth-mathvol", "--trace-db", str(home), "--json")
    assert again.exit_code == 0, again.output
    second = json.loads(again.stdout)
    assert (second["sessions_added"], second["bytes"], second["downloaded"]) == (0, 0, 0)
    assert second["sessions_skipped"] == len(have)

    # The same rollouts recorded by `serve` on this machine export the same SFT data.
    local = tmp_path / "local.db"
    with LocalRunner(ServeSettings(app=str(app_file), env=Env(), keys=ServerKeys((key,), "t"),
                                   traces=parse_trace_db(str(local)))).start() as runner:
        bodies = [rollout_body(r, int(r.rsplit("-", 1)[1]), inference) for r in sorted(have)]
        assert {s for _, s in asyncio.run(fire(runner.url, key, bodies))} == {200}
    pulled_sft = _sft(home, tmp_path / "pulled.jsonl")
    assert len(pulled_sft) >= len(have)
    assert pulled_sft == _sft(local, tmp_path / "local.jsonl")


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"container {pid} did not stop")
