"""The same tests for every backend: create, run, files, limits on output, terminate."""

from __future__ import annotations

import asyncio

import pytest

from synth_deploy.errors import SandboxError, UsageError
from synth_deploy.sandbox import SandboxSettings, open_sandbox
from synth_deploy.tracing import SessionTracer


def run(coro):
    return asyncio.run(coro)


SETTINGS = SandboxSettings(command_timeout_s=10, timeout_s=60)


def test_a_command_gives_its_exit_code_and_output(any_backend):
    async def go():
        async with await open_sandbox(SETTINGS, app="t", rollout="r", backend=any_backend) as box:
            ok = await box.run("echo out; echo err >&2")
            failed = await box.run(["sh", "-c", "exit 3"])
            return ok, failed

    ok, failed = run(go())
    assert (ok.exit_code, ok.stdout, ok.stderr, ok.limit) == (0, "out\n", "err\n", None)
    assert ok.ok and not failed.ok and failed.exit_code == 3


def test_files_go_in_and_come_out_byte_for_byte(any_backend):
    data = bytes(range(256)) * 10

    async def go():
        async with await open_sandbox(SETTINGS, app="t", rollout="r", backend=any_backend) as box:
            await box.write_file("deep/dir/blob.bin", data)
            listed = await box.run("ls deep/dir && wc -c < deep/dir/blob.bin")
            back = await box.read_file("deep/dir/blob.bin")
            with pytest.raises(SandboxError, match="missing.txt"):
                await box.read_file("missing.txt")
            return listed, back

    listed, back = run(go())
    assert back == data
    assert listed.stdout.split() == ["blob.bin", str(len(data))]


def test_stdin_reaches_the_command(any_backend):
    async def go():
        async with await open_sandbox(SETTINGS, app="t", rollout="r", backend=any_backend) as box:
            return await box.run("tr a-z A-Z", stdin="shout\n")

    assert run(go()).stdout == "SHOUT\n"


def test_output_past_the_cap_is_cut_and_said_so(any_backend):
    settings = SandboxSettings(command_timeout_s=10, output_bytes=1000)

    async def go():
        async with await open_sandbox(settings, app="t", rollout="r", backend=any_backend) as box:
            return await box.run("yes | head -c 100000; echo done >&2")

    result = run(go())
    assert len(result.stdout) == 1000 and result.truncated
    assert result.stderr == "done\n" and result.exit_code == 0


def test_a_command_past_its_time_limit_is_killed(any_backend):
    async def go():
        async with await open_sandbox(SETTINGS, app="t", rollout="r", backend=any_backend) as box:
            slow = await box.run("echo started; sleep 30", timeout_s=0.5)
            after = await box.run("echo still usable")
            return slow, after

    slow, after = run(go())
    assert slow.limit == "timeout" and slow.timed_out and slow.exit_code is None
    assert 0.5 <= slow.duration_s < 5
    assert after.stdout == "still usable\n"


def test_terminate_ends_its_processes_and_later_use_is_refused(any_backend):
    async def go():
        box = await open_sandbox(SETTINGS, app="t", rollout="r", backend=any_backend)
        started = await box.run("sleep 300 > /dev/null 2>&1 & echo $!")
        await box.terminate()
        await box.terminate()  # idempotent
        with pytest.raises(SandboxError, match="has ended"):
            await box.run("true")
        return box, int(started.stdout)


    box, pid = run(go())
    assert box.ended
    assert any_backend.leftovers(box) == []


def test_each_command_is_a_runtime_event_of_the_timestep():
    tracer = SessionTracer()
    tracer.start_timestep("turn-1")

    async def go():
        async with await open_sandbox(SETTINGS, app="t", rollout="r", tracer=tracer) as box:
            await box.run("echo hi; exit 4")
            return box.busy_s

    busy = run(go())
    events = [e for e in tracer.finish().timesteps[0].events if e.event_type == "runtime"]
    assert [e.system_instance_id for e in events] == ["sandbox", "sandbox"]
    created, command = (e.metadata["sandbox"] for e in events)
    assert created["created"]["network"] == "off"
    assert (command["command"], command["exit_code"], command["stdout"]) == (
        "echo hi; exit 4", 4, "hi\n")
    assert events[1].latency_ms == pytest.approx(busy * 1000)


def test_settings_refuse_what_cannot_work():
    with pytest.raises(UsageError, match="memory_mb"):
        SandboxSettings(memory_mb=1)
    with pytest.raises(UsageError, match="outlive"):
        SandboxSettings(timeout_s=5, command_timeout_s=10)
    with pytest.raises(UsageError, match=r"cidr_allowlist\[1\]"):
        SandboxSettings(cidr_allowlist=("10.0.0.0/8", "nope"))
    with pytest.raises(UsageError, match="unknown sandbox setting"):
        SandboxSettings().updated(gpu="a100")
    assert SandboxSettings(cidr_allowlist=["1.2.3.4/32"]).describe()["network"] == \
        "only 1.2.3.4/32"
