"""The local backend's limits and its sweeper, on real processes.

Model code that loops forever, forks without end, writes 10 GB or calls out to the network
is stopped by a limit, and says which; a server killed with its sandboxes running leaves
them to the sweeper of the next one.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from sandbox_processes import sandbox_processes, wait_for

from synth_deploy.errors import SandboxError
from synth_deploy.sandbox import LocalBackend, SandboxSettings, open_sandbox

SETTINGS = SandboxSettings(command_timeout_s=5, timeout_s=60, max_file_mb=64,
                           max_processes=32)


def contained(backend: LocalBackend, command: str, **settings):
    async def go():
        async with await open_sandbox(SETTINGS.updated(**settings), app="t", rollout="r",
                                      backend=backend) as box:
            result = await box.run(command)
            return result, box
    result, box = asyncio.run(go())
    assert sandbox_processes(box.id) == [], "the sandbox's processes outlived it"
    return result


def test_an_infinite_loop_is_stopped_at_its_time_limit(local_backend):
    result = contained(local_backend, "while :; do :; done", command_timeout_s=1)
    assert result.limit == "timeout" and result.exit_code is None


def test_a_loop_past_its_cpu_time_is_killed_by_the_kernel(local_backend):
    # The kernel's own bound (SIGXCPU), which holds even when the server is gone.
    result = contained(local_backend, "exec python3 -c 'while True: pass'",
                       command_timeout_s=1.5)
    assert result.limit in ("cpu_time", "timeout")


@pytest.mark.skipif(os.geteuid() != 0, reason="a process limit per sandbox needs a uid of "
                    "its own (root) or a user namespace")
def test_a_fork_bomb_runs_into_the_process_limit(local_backend):
    result = contained(local_backend, "bash -c ':(){ :|:& };:'; sleep 3; echo alive",
                       command_timeout_s=2)
    assert result.limit == "timeout"
    assert "fork" in result.stderr and "Resource temporarily unavailable" in result.stderr


def test_a_10gb_write_stops_at_the_file_size_limit(local_backend):
    async def go():
        async with await open_sandbox(SETTINGS.updated(max_file_mb=8), app="t", rollout="r",
                                      backend=local_backend) as box:
            return await box.run("head -c 10G /dev/zero > big"), await box.run("wc -c < big")

    write, size = asyncio.run(go())
    assert write.limit == "file_size" and write.exit_code != 0
    assert int(size.stdout) == 8 * 2**20


def test_memory_past_the_limit_fails_the_allocation(local_backend):
    result = contained(local_backend, "python3 -c 'b = bytearray(400 * 2**20)'",
                       memory_mb=128)
    assert result.exit_code == 1 and "MemoryError" in result.stderr


def test_a_network_call_is_refused_unless_allowed(local_backend):
    if not local_backend.isolation()["network"].startswith("blocked"):
        pytest.skip("this machine does not allow network namespaces")
    call = ("python3 -c \"import socket; s = socket.socket(); s.settimeout(3); "
            "s.connect(('1.1.1.1', 53))\"")
    result = contained(local_backend, call)
    assert result.exit_code == 1 and "Network is unreachable" in result.stderr
    # Loopback is down too: the server's own port is out of reach.
    result = contained(local_backend, "python3 -c \"import socket; "
                       "socket.create_connection(('127.0.0.1', 9), timeout=3)\"")
    assert "Network is unreachable" in result.stderr or "Cannot assign" in result.stderr


def test_the_sandbox_cannot_read_what_only_the_server_may(local_backend, sandbox_root):
    if not local_backend.own_users:
        pytest.skip("only a server run as root gives each sandbox a user of its own")
    secret = sandbox_root.parent / "key.env"  # in a folder the sandbox may pass
    secret.write_text("ENVIRONMENT_API_KEY=sk_secret")
    secret.chmod(0o600)
    shared = sandbox_root.parent / "shared.txt"
    shared.write_text("anyone may read this")
    shared.chmod(0o644)
    assert contained(local_backend, f"cat {shared}").stdout == "anyone may read this"
    result = contained(local_backend, f"cat {secret}")
    assert result.exit_code != 0 and "Permission denied" in result.stderr


def test_a_root_its_sandboxes_could_not_reach_is_refused_naming_the_folder(tmp_path):
    backend = LocalBackend(tmp_path / "closed" / "sandboxes")
    if not backend.own_users:
        pytest.skip("only sandboxes with users of their own need to pass the folders above")
    with pytest.raises(SandboxError, match="closed to other users") as caught:
        asyncio.run(open_sandbox(SETTINGS, app="t", rollout="r", backend=backend))
    assert "chmod o+x" in caught.value.hint


OWNER = textwrap.dedent("""
    import asyncio, sys
    from synth_deploy.sandbox import LocalBackend, SandboxSettings, open_sandbox

    async def main():
        backend = LocalBackend(sys.argv[1])
        boxes = [await open_sandbox(SandboxSettings(), app="swept", rollout=f"r{i}",
                                    backend=backend) for i in range(3)]
        for box in boxes:  # a process in the background, one in a group of its own
            await box.run("sleep 300 > /dev/null 2>&1 &")
            await box.run("setsid sleep 300 > /dev/null 2>&1 &")
        print(" ".join(b.id for b in boxes), flush=True)
        await asyncio.sleep(300)

    asyncio.run(main())
""")


def test_the_sweeper_ends_what_a_killed_server_left(sandbox_root):
    root = sandbox_root
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(root)], stdout=subprocess.PIPE,
                             text=True)
    try:
        ids = owner.stdout.readline().split()
        assert len(ids) == 3
        assert all(len(sandbox_processes(i)) == 2 for i in ids)
        backend = LocalBackend(root)
        assert backend.sweep_now() == []  # a live server's sandboxes are its own
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=10)
        assert all(sandbox_processes(i) for i in ids), "SIGKILL left them running"
        ended = backend.sweep_now()
    finally:
        owner.kill()
        owner.wait()
    assert sorted(ended) == sorted(ids)
    assert [i for i in ids if sandbox_processes(i)] == []
    assert list((root / "swept").iterdir()) == []


def test_a_sandbox_records_who_owns_it(local_backend):
    async def go():
        async with await open_sandbox(SETTINGS, app="my app", rollout="run/1",
                                      backend=local_backend) as box:
            await box.run("true")
            folder = next((local_backend.root / "my_app").iterdir())
            return box, json.loads((folder / "sandbox.json").read_text()), folder.name

    box, record, name = asyncio.run(go())
    assert name == f"run_1-{box.id}"
    assert record["app"] == "my app" and record["rollout"] == "run/1"
    assert record["owner_pid"] == os.getpid() and len(record["groups"]) == 1
    assert not (local_backend.root / "my_app" / name).exists()
    wait_for(lambda: not sandbox_processes(box.id), what="no process left")
