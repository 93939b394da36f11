"""Stopping a tunnel sends cloudflared one SIGTERM, however many threads stop it (issue 12).

cloudflared drops its signal handlers once its graceful shutdown begins, so that a second
SIGTERM forces it down (tunnel/signal.go); the stand-in does the same. The caller's `stop()`
and the tunnel's supervisor both stopped the child, and when the drain outlasted the
supervisor's 0.2 s poll a second SIGTERM killed it (exit -15): the once-in-two-runs failure of
the quick-tunnel test. A drain of a second makes that race certain, not occasional.
"""

from __future__ import annotations

import sys
import threading

from standins.cloudflared_helpers import COMMAND, StandinState, wait_gone

from synth_deploy.tunnel import Tunnel, TunnelConfig, TunnelProcess

DRAIN = {"drain_s": "1.0"}


def test_a_tunnel_stop_sends_one_signal_and_cloudflared_drains(tmp_path, math_server, api_key):
    standin = StandinState(tmp_path / "standin")
    tunnel = Tunnel(TunnelConfig(math_server.url, start_timeout_s=10, verify_timeout_s=10),
                    api_key=api_key, command=COMMAND, env=standin.env("ok", **DRAIN),
                    resolve=standin.resolve).start()
    tunnel.stop()
    [launch] = standin.launches()
    assert wait_gone([launch["pid"]]) == []
    assert tunnel.process.returncode == 0  # drained, not killed
    assert launch["signals"] == 1
    assert any("graceful shutdown" in line for line in tunnel.logs())


def test_concurrent_stops_send_one_signal_and_agree_on_the_exit(tmp_path):
    standin = StandinState(tmp_path / "standin")
    proc = TunnelProcess([*COMMAND, "tunnel", "--no-autoupdate", "--url",
                          "http://127.0.0.1:9"], env=standin.env("ok", **DRAIN)).start()
    while not any("Registered tunnel connection" in line for line in proc.logs()):
        assert proc.alive, proc.logs()
        threading.Event().wait(0.02)
    codes: list[int | None] = []
    stoppers = [threading.Thread(target=lambda: codes.append(proc.stop(timeout_s=10)))
                for _ in range(4)]
    for thread in stoppers:
        thread.start()
    for thread in stoppers:
        thread.join(20)
    assert codes == [0, 0, 0, 0]
    assert standin.launches()[0]["signals"] == 1


def test_a_second_signal_still_forces_a_stuck_cloudflared_down(tmp_path):
    # The other side of cloudflared's contract: the kit's SIGKILL after stop_timeout_s ends a
    # drain that takes too long.
    standin = StandinState(tmp_path / "standin")
    proc = TunnelProcess([sys.executable, *COMMAND[1:], "tunnel", "--no-autoupdate", "--url",
                          "http://127.0.0.1:9"],
                         env=standin.env("ok", drain_s="30")).start()
    while not any("Registered tunnel connection" in line for line in proc.logs()):
        threading.Event().wait(0.02)
    assert proc.stop(timeout_s=0.5) == -9
