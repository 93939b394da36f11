"""The stand-in Volume (tests/standins/modal_volume.py) keeps Modal's documented rules: each
"container" (a process here) sees its own view, changes are visible elsewhere only after a
commit, the last writer of a file wins, a reload refuses while a file is open, and Modal's
background commit persists what a container wrote without it asking."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

STANDINS = Path(__file__).resolve().parents[1] / "standins"

CONTAINER = """
import json, sys, time
sys.path.insert(0, {standins!r})
import modal_volume
modal_volume.install({{"vol": ({store!r}, {view!r})}}, background_s={background})
import modal
from pathlib import Path
view, vol = Path({view!r}), modal.Volume.from_name("vol")
for line in sys.stdin:
    cmd, _, arg = line.strip().partition(" ")
    try:
        if cmd == "write":
            name, text = arg.split(" ", 1)
            (view / name).write_text(text)
        elif cmd == "read":
            path = view / arg
            print(json.dumps(path.read_text() if path.exists() else None), flush=True)
            continue
        elif cmd == "hold":
            held = open(view / arg)
        elif cmd in ("commit", "reload"):
            getattr(vol, cmd)()
        print(json.dumps("ok"), flush=True)
    except RuntimeError as exc:
        print(json.dumps(f"error: {{exc}}"), flush=True)
"""


class Container:
    def __init__(self, root: Path, name: str, background: float = 3600.0) -> None:
        store, view = root / "store", root / name
        store.mkdir(exist_ok=True)
        shutil.copytree(store, view)  # what the stand-in does when a container starts
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CONTAINER.format(standins=str(STANDINS), store=str(store),
                                                   view=str(view), background=background)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def __call__(self, line: str):
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


def test_views_commit_reload_and_the_last_writer(tmp_path):
    a, b = Container(tmp_path, "a"), Container(tmp_path, "b")
    store = tmp_path / "store"
    try:
        assert a("write f.txt from-a") == "ok"
        assert not (store / "f.txt").exists()  # not committed: nowhere else
        assert a("commit") == "ok" and (store / "f.txt").read_text() == "from-a"
        assert b("read f.txt") is None  # b's view is its own until it reloads
        assert b("reload") == "ok" and b("read f.txt") == "from-a"
        assert b("write f.txt from-b") == "ok" and a("write f.txt from-a-again") == "ok"
        assert a("commit") == "ok" and b("commit") == "ok"
        assert (store / "f.txt").read_text() == "from-b"  # the last writer wins
        assert b("hold f.txt") == "ok"
        assert b("reload").startswith("error: there are open files")
    finally:
        a.stop()
        b.stop()


def test_background_commits_persist_and_sigkill_loses_the_rest(tmp_path):
    busy = Container(tmp_path, "busy", background=0.2)
    killed = Container(tmp_path, "killed")
    try:
        assert busy("write bg.txt saved") == "ok"
        deadline = time.monotonic() + 10
        while not (tmp_path / "store" / "bg.txt").exists():
            assert time.monotonic() < deadline, "no background commit"
            time.sleep(0.05)
        assert killed("write lost.txt never-committed") == "ok"
        killed.proc.send_signal(signal.SIGKILL)
        killed.proc.wait(timeout=10)
        assert not (tmp_path / "store" / "lost.txt").exists()
    finally:
        busy.stop()
        killed.stop()
