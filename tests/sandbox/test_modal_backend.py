"""The Modal backend against the stand-in (tests/standins/modal_sandbox.py): what it asks
Modal for, the limits it adds, and its lease-based sweeper across processes."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
import time

import httpx
import pytest
from sandbox_processes import wait_for

from synth_deploy.sandbox import ModalBackend, SandboxSettings, open_sandbox, use_backend
from synth_deploy.serving import create_app
from synth_deploy.taskapp.registry import load_app


def test_a_sandbox_is_created_with_the_settings_and_tags(modal_backend, modal_standin):
    settings = SandboxSettings(image="python:3.12-slim", packages=("numpy",), cpu=0.5,
                               memory_mb=256, timeout_s=90.5, command_timeout_s=5,
                               cidr_allowlist=("10.0.0.0/8",))

    async def go():
        async with await open_sandbox(settings, app="code", rollout="run-7",
                                      backend=modal_backend) as box:
            return box.id, modal_standin.record(box.id)

    sandbox_id, record = asyncio.run(go())
    assert record["image"] == ["from python:3.12-slim", "pip_install numpy",
                               "workdir /sandbox"]
    assert (record["timeout"], record["cpu"], record["memory"]) == (91, [0.5, 0.5], [256, 256])
    assert record["block_network"] is False and record["cidr_allowlist"] == ["10.0.0.0/8"]
    assert record["workdir"] == "/sandbox" and record["app_id"] == "ap-synth-test"
    tags = record["tags"]
    assert (tags["synth_deploy_app"], tags["synth_deploy_rollout"]) == ("code", "run-7")
    assert float(tags["synth_deploy_lease"]) > time.time()
    assert modal_standin.processes(sandbox_id) == []


def test_network_is_blocked_unless_allowed(modal_backend):
    call = ("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), "
            "timeout=3)\"")

    async def go(settings):
        async with await open_sandbox(settings, app="t", rollout="r",
                                      backend=modal_backend) as box:
            return await box.run(call)

    import os
    if os.geteuid() != 0:
        pytest.skip("the stand-in blocks the network with unshare, which needs root")
    blocked = asyncio.run(go(SandboxSettings()))
    assert blocked.exit_code == 1 and "Network is unreachable" in blocked.stderr


def test_a_10gb_write_stops_at_the_file_size_limit(modal_backend):
    async def go():
        async with await open_sandbox(SandboxSettings(max_file_mb=4), app="t", rollout="r",
                                      backend=modal_backend) as box:
            return await box.run("head -c 10G /dev/zero > big"), await box.run("wc -c < big")

    write, size = asyncio.run(go())
    assert write.limit == "file_size" and int(size.stdout) == 4 * 2**20


OWNER = textwrap.dedent("""
    import asyncio, sys
    sys.path.insert(0, sys.argv[2])
    from standins.modal_sandbox import ModalSandboxStandin
    from synth_deploy.sandbox import ModalBackend, SandboxSettings, open_sandbox

    async def main():
        backend = ModalBackend("synth-test", modal=ModalSandboxStandin(sys.argv[1]),
                               lease_s=float(sys.argv[3]))
        boxes = [await open_sandbox(SandboxSettings(), app="swept", rollout=f"r{i}",
                                    backend=backend) for i in range(3)]
        for box in boxes:
            await box.run("sleep 300 > /dev/null 2>&1 &")
        print(" ".join(b.id for b in boxes), flush=True)
        await asyncio.sleep(300)

    asyncio.run(main())
""")


def owner(modal_standin, lease_s: float) -> tuple[subprocess.Popen, list[str]]:
    tests = str(__import__("pathlib").Path(__file__).resolve().parents[1])
    proc = subprocess.Popen([sys.executable, "-c", OWNER, str(modal_standin.state), tests,
                             str(lease_s)], stdout=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline().split()


def test_a_live_container_keeps_its_sandboxes_and_a_killed_ones_are_swept(modal_standin):
    proc, ids = owner(modal_standin, lease_s=1.5)
    sweeper = ModalBackend("synth-test", modal=modal_standin)
    try:
        assert len(ids) == 3 and all(modal_standin.processes(i) for i in ids)
        time.sleep(3.0)  # two lease periods: renewed by the live owner
        assert asyncio.run(sweeper.sweep("swept")) == []
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert all(modal_standin.processes(i) for i in ids), "a sandbox outlives its container"
        ended = wait_for(lambda: asyncio.run(sweeper.sweep("swept")), timeout_s=20,
                         what="the lease of the killed container's sandboxes to run out")
    finally:
        proc.kill()
        proc.wait()
    assert sorted(ended) == sorted(ids)
    assert [i for i in ids if modal_standin.processes(i)] == []


def test_the_code_app_runs_its_tests_in_modal_sandboxes(serve, api_key, mock_policy,
                                                        modal_backend, modal_standin):
    use_backend(modal_backend)
    try:
        server = serve(create_app(load_app("code").build_config(), api_keys=[api_key]))
        rewards = []
        for seed in range(3):
            body = httpx.post(server.url + "/rollout", headers={"X-API-Key": api_key},
                              timeout=60, json={
                                  "run_id": f"m-{seed}", "env": {"seed": seed},
                                  "policy": {"config": {"model": "m", "inference_url":
                                                        mock_policy.url + "/v1"}}}).json()
            rewards.append(body["metrics"]["outcome_reward"])
    finally:
        use_backend(None)
    assert rewards == [1.0, 1.0, 0.8]  # seed 2 has an edge case the mock misses
    assert len(modal_standin.created) == 3
    assert all(modal_standin.processes(i) == [] for i in modal_standin.created)
    assert modal_standin.record(modal_standin.created[0])["image"][0] == \
        "from python:3.12-slim"


def test_every_call_the_backend_makes_is_one_modal_accepts(modal_backend, modal_standin):
    # The stand-in takes what the backend sends; the real client (installed, never called
    # here) must take the same keywords, or the backend only works on the stand-in.
    import inspect

    import modal

    async def go():
        settings = SandboxSettings(cidr_allowlist=("10.0.0.0/8",))
        async with await open_sandbox(settings, app="t", rollout="r",
                                      backend=modal_backend) as box:
            await box.run("cat", stdin="x")
        await modal_backend.sweep("t")

    asyncio.run(go())
    real = {"Sandbox.create": modal.Sandbox.create, "Sandbox.exec": modal.Sandbox.exec,
            "Sandbox.list": modal.Sandbox.list, "Sandbox.set_tags": modal.Sandbox.set_tags}
    called = {name for name, _ in modal_standin.calls}
    assert {"Sandbox.create", "Sandbox.exec", "Sandbox.list"} <= called
    for name, keywords in modal_standin.calls:
        accepted = inspect.signature(real[name]).parameters
        assert set(keywords) <= set(accepted), (name, set(keywords) - set(accepted))
    assert "lookup" in dir(modal.App) and "create_if_missing" in inspect.signature(
        modal.App.lookup).parameters
