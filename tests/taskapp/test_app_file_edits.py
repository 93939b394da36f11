"""An edited app file is what the next process serves, even when Python's bytecode cache
would take the edit for the file it compiled (same size, same time to the second: an edit
within the second, a `cp -p`, a checkout). Real child processes, each importing the file."""

from __future__ import annotations

import os
import subprocess
import sys

APP = """
from synth_deploy.taskapp import TaskApp

task_app = TaskApp("edited", name="Edited", description="version {version}")

@task_app.rollout
def rollout(request, ctx):
    ctx.tracer.record_outcome_reward(1.0)
"""
LOAD = ("import sys; from synth_deploy.taskapp.registry import load_app; "
        "print(load_app(sys.argv[1]).description)")


def served_version(path) -> str:
    done = subprocess.run([sys.executable, "-c", LOAD, str(path)], capture_output=True,
                          text=True, timeout=60, cwd=path.parent)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_an_edit_of_the_same_size_and_time_is_served(tmp_path):
    path = tmp_path / "task_app.py"
    path.write_text(APP.format(version="A"))
    stamp = path.stat().st_mtime_ns
    assert served_version(path) == "version A"
    path.write_text(APP.format(version="B"))
    os.utime(path, ns=(stamp, stamp))  # what the cache checks is as it was
    assert served_version(path) == "version B"
    assert not (tmp_path / "__pycache__").exists()  # nothing left to go stale
