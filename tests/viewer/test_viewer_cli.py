"""`synth-deploy traces view` as a real child process: it serves on 127.0.0.1, says how to
reach it over SSH, stops cleanly on Ctrl-C, and never changes a byte of the trace file."""

from __future__ import annotations

import hashlib
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from known_traces import build_known_store
from processes import clean_env, run_cli
from trace_files import make_synth_ai_db


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def start_view(cwd: Path, *args: str) -> tuple[subprocess.Popen, str, str]:
    """The command as a child; returns it, its URL and what it printed up to the URL."""
    proc = subprocess.Popen([sys.executable, "-m", "synth_deploy.cli", "traces", "view",
                             "--port", "0", "--no-browser", *args], cwd=cwd,
                            env=clean_env(PYTHONUNBUFFERED="1", COLUMNS="200"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    printed = ""
    deadline = time.monotonic() + 30
    while "then open http" not in printed:  # the URL, then how to reach it over SSH
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"viewer did not start: {printed}{proc.stderr.read()}")
        # Raw reads: a buffered readline could hold the next line where select cannot see it.
        if select.select([proc.stdout], [], [], 0.5)[0]:
            printed += os.read(proc.stdout.fileno(), 65536).decode()
    url = printed.split("viewer on ", 1)[1].split()[0]
    return proc, url, printed


def stop(proc: subprocess.Popen) -> tuple[int, str]:
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=45)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, out


def test_view_serves_a_synth_ai_file_read_only_and_stops_on_ctrl_c(tmp_path):
    make_synth_ai_db(tmp_path / "old.db")
    before = digest(tmp_path)
    proc, url, printed = start_view(tmp_path, "--trace-db", str(tmp_path / "old.db"))
    try:
        assert url.startswith("http://127.0.0.1:")
        port = url.rsplit(":", 1)[1]
        assert f"ssh -N -L {port}:127.0.0.1:{port}" in printed
        assert "read-only" in printed
        rows = httpx.get(url + "/api/sessions", timeout=30).json()["rows"]
        assert [(r["session_id"], r["app_id"], r["total_reward"]) for r in rows] == [
            ("old-session", "crafter", 0.25)]
        assert "synth-deploy traces" in httpx.get(url + "/", timeout=30).text
    finally:
        code, out = stop(proc)
    assert code == 0 and "viewer stopped" in out
    assert digest(tmp_path) == before  # not migrated, not even a journal switch


def test_view_of_our_own_store_leaves_it_as_it_was(tmp_path):
    sessions = build_known_store(tmp_path / "t.db")
    before = digest(tmp_path)
    proc, url, _ = start_view(tmp_path, "--trace-db", "t.db")
    try:
        assert httpx.get(url + "/api/choices", timeout=30).json()["sessions"] == len(sessions)
        assert httpx.get(url + "/api/export.jsonl", timeout=30).status_code == 200
    finally:
        code, _ = stop(proc)
    assert code == 0 and digest(tmp_path) == before


def test_view_on_another_loopback_address_keeps_the_host_check(tmp_path):
    # 127.0.0.2 is loopback too: binding there must not let a DNS name reach the traces.
    build_known_store(tmp_path / "t.db")
    proc, url, _ = start_view(tmp_path, "--trace-db", "t.db", "--host", "127.0.0.2")
    try:
        assert url.startswith("http://127.0.0.2:")
        assert httpx.get(url + "/api/choices", timeout=30).status_code == 200
        evil = httpx.get(url + "/api/choices", headers={"Host": "evil.example"}, timeout=30)
        assert evil.status_code == 400
    finally:
        stop(proc)


def test_view_of_a_missing_database_says_so_and_creates_nothing(tmp_path):
    result = run_cli(tmp_path, "traces", "view", "--no-browser", "--trace-db", "nope/t.db",
                     timeout=60)
    assert result.returncode != 0
    assert "no trace database at nope/t.db" in result.stderr
    assert "hint:" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_view_on_a_taken_port_fails_with_the_fix(tmp_path):
    build_known_store(tmp_path / "t.db")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(tmp_path, "traces", "view", "--no-browser", "--trace-db", "t.db",
                         "--port", str(port), timeout=60)
    assert result.returncode == 1
    assert f"failed to start on 127.0.0.1:{port}" in result.stderr
    assert "port" in result.stderr.split("hint:", 1)[1]
