"""`deploy` and `modal-serve` with a Modal token but no network (issue 12): they stop within a
bound and name what was unreachable, instead of waiting on a `modal` child that retries in
silence. The stand-in `modal` CLI (tests/standins/modal_cli.py) retries its connection the way
Modal's does; MODAL_SERVER_URL points at a loopback stand-in for the API
(tests/standins/modal_api.py), so nothing here can reach Modal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from standins.modal_api import ModalAPIStandin
from standins.modal_helpers import COMMAND as STANDIN

from synth_deploy.env import Env
from synth_deploy.errors import DeployError
from synth_deploy.modal import (
    DeployOptions,
    deploy,
    modal_api_endpoints,
    require_modal_reachable,
)

BOUND_S = 30  # the test's own patience: far above the kit's bound, far below modal's retries


def run_cli(tmp_path: Path, api: ModalAPIStandin, *args: str) -> tuple[int, str, float]:
    (tmp_path / ".env").write_text("ENVIRONMENT_API_KEY=sk_env_offline_1234567890abcdef\n")
    state = tmp_path / "modal-state"
    state.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MODAL_", "STANDIN_"))}
    env.update(MODAL_TOKEN_ID="ak-standin", MODAL_TOKEN_SECRET="as-standin",
               MODAL_SERVER_URL=api.url, STANDIN_MODAL_STATE_DIR=str(state), COLUMNS="400")
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "synth_deploy.cli", *args,
                               "--modal-cli", STANDIN], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=BOUND_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"`synth-deploy {' '.join(args)}` was still waiting after {BOUND_S}s "
                    f"(output: {exc.stderr!r})")
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


@pytest.mark.parametrize("command", [["deploy", "math"], ["deploy", "math", "--no-check"],
                                     ["modal-serve", "math"]])
def test_no_network_fails_fast_and_names_modals_api(tmp_path, command):
    with ModalAPIStandin("down") as api:
        code, output, elapsed = run_cli(tmp_path, api, *command)
    assert code == 1, output
    assert f"Modal's API at 127.0.0.1:{api.port} is unreachable" in output
    assert "network" in output and "Traceback" not in output
    assert elapsed < 20


def test_a_network_that_drops_packets_is_bounded_by_the_connect_timeout(tmp_path):
    (tmp_path / ".env").write_text("")
    with ModalAPIStandin("dropping") as api:
        env = Env({"ENVIRONMENT_API_KEY": "sk_env_offline_1234567890abcdef",
                   "MODAL_TOKEN_ID": "ak-standin", "MODAL_TOKEN_SECRET": "as-standin",
                   "MODAL_SERVER_URL": api.url})
        started = time.monotonic()
        with pytest.raises(DeployError) as err:
            deploy("math", env, DeployOptions(check=False, connect_timeout_s=1.0,
                                              env_out=tmp_path / ".env"))
        elapsed = time.monotonic() - started
    assert 0.9 < elapsed < 6
    assert f"Modal's API at 127.0.0.1:{api.port}" in err.value.message
    assert "1s" in err.value.message and "nothing was sent" in err.value.message


def test_a_list_of_api_servers_is_probed_server_by_server():
    # Modal's own default is a list ("https://api.modal.com,https://api.modal2.com"): its
    # client uses the first server that connects, and the error names each host.
    assert modal_api_endpoints("https://api.modal.com,https://api.modal2.com") == [
        ("api.modal.com", 443), ("api.modal2.com", 443)]
    with ModalAPIStandin("down") as first, ModalAPIStandin("down") as second:
        servers = f"{first.url},{second.url}"
        with pytest.raises(DeployError) as err:
            require_modal_reachable(Env({"MODAL_SERVER_URL": servers}), timeout_s=5)
    message = err.value.message
    assert message.startswith(f"Modal's API at 127.0.0.1:{first.port} or "
                              f"127.0.0.1:{second.port} is unreachable (127.0.0.1:{first.port}: ")
    assert "," not in message.split(" is unreachable")[0]
    with ModalAPIStandin("down") as down, ModalAPIStandin("up") as up:
        require_modal_reachable(Env({"MODAL_SERVER_URL": f"{down.url},{up.url}"}), timeout_s=5)


@pytest.mark.slow
def test_a_reachable_api_lets_the_deploy_through(tmp_path):
    # The same stand-ins with the API up: the bound does not get in the way of a deploy.
    with ModalAPIStandin("up") as api:
        code, output, _ = run_cli(tmp_path, api, "deploy", "math", "--no-check")
    try:
        assert code == 0, output
        assert "http://127.0.0.1:" in output
    finally:
        pids = tmp_path / "modal-state" / "pids"  # the "container" the stand-in started
        for pid in (int(p) for p in pids.read_text().split()) if pids.exists() else ():
            stop(pid)


def stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
        for _ in range(100):
            os.kill(pid, 0)
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
