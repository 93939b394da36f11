"""`deploy --dry-run` and `modal-serve` as a first-time user meets them (issue 14): the plan
said once, resources said plainly, and `modal-serve --json` for machines. Modal is the
stand-in of tests/standins/modal_cli.py; nothing reaches Modal's servers."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from standins.modal_helpers import COMMAND as STANDIN
from typer.testing import CliRunner

from synth_deploy.cli import app as cli_app

PLAIN_APP = '''
from synth_deploy.taskapp import TaskApp

task_app = TaskApp("plain", name="Plain", description="No Modal settings at all.")


@task_app.rollout
async def rollout(request, ctx):
    ctx.tracer.record_outcome_reward(1.0)
'''


def test_dry_run_says_the_plan_once_and_resources_plainly(standin):  # noqa: F811
    app_dir = standin["dir"] / "apps" / "plain"
    app_dir.mkdir(parents=True)
    (app_dir / "task_app.py").write_text(PLAIN_APP)
    result = CliRunner().invoke(cli_app, ["deploy", "plain", "--dry-run"],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert result.output.count("-> Modal app") == 1
    [resources] = [line for line in result.stdout.splitlines() if line.startswith("Resources")]
    assert "memory Modal's default · cpu Modal's default" in resources
    assert "default MiB" not in result.output


def _lines(proc: subprocess.Popen) -> tuple[queue.Queue, threading.Thread]:
    """The child's stdout lines as they come (the reader ends at its EOF)."""
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:
            lines.put(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    return lines, reader


@pytest.mark.slow
def test_modal_serve_json_streams_events_and_announces_the_url(standin):  # noqa: F811
    proc = subprocess.Popen(
        [sys.executable, "-m", "synth_deploy.cli", "modal-serve", "math", "--json",
         "--modal-cli", STANDIN], cwd=standin["dir"], env=dict(os.environ),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        (lines, reader), events = _lines(proc), []
        deadline = time.monotonic() + 90
        while not any(e["event"] == "ready" for e in events):
            assert time.monotonic() < deadline, events
            try:
                events.append(json.loads(lines.get(timeout=1)))
            except queue.Empty:
                assert proc.poll() is None, proc.stderr.read()
        [ready] = [e for e in events if e["event"] == "ready"]
        assert all(e["event"] == "modal" and isinstance(e["line"], str) for e in events
                   if e is not ready)
        assert any("Created web function" in e.get("line", "") for e in events)
        # The URL is the one the "container" serves.
        health = httpx.get(ready["url"] + "/health", headers={"X-API-Key": standin["key"]},
                           timeout=10)
        assert health.status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: modal serve stops with us
        proc.wait(timeout=120)
    assert proc.returncode == 130
    reader.join(timeout=10)
    rest = [json.loads(lines.get()) for _ in range(lines.qsize())]
    assert all(e["event"] == "modal" for e in rest)
    assert standin["key"] not in json.dumps(events + rest)
