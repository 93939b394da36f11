"""The tunnel library against the cloudflared stand-in: each startup path, restarts, seams.

The stand-in (tests/standins/cloudflared) is a real child process speaking cloudflared's
command line, logs and metrics endpoints, and forwarding HTTP to the origin; the public
*.trycloudflare.com name is mapped to its forwarder through `Tunnel(resolve=...)`.
"""

from __future__ import annotations

import os
import stat
import sys
import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest
from processes import run_cli
from standins.cloudflared_helpers import (
    COMMAND,
    STANDIN,
    StandinState,
    make_token,
    wait_gone,
)

from synth_deploy.env import load_env
from synth_deploy.errors import UsageError
from synth_deploy.serving import LocalRunner, ServeSettings, server_keys
from synth_deploy.tunnel import (
    CloudflaredNotFoundError,
    MetricsClient,
    Tunnel,
    TunnelConfig,
    TunnelError,
    TunnelProcess,
    TunnelRateLimitedError,
    concurrency_cap,
    expose,
    find_cloudflared,
    install_hint,
    is_quick_tunnel,
    parse_counters,
)


@pytest.fixture
def standin(tmp_path) -> StandinState:
    return StandinState(tmp_path / "standin")


def open_tunnel(standin, origin, api_key, mode="ok", *, standin_env=None, resolve=None,
                on_event=None, **settings) -> Tunnel:
    """A tunnel to ``origin`` through the stand-in behaving as ``mode``; ``settings`` go to
    `TunnelConfig`."""
    settings.setdefault("start_timeout_s", 10)
    settings.setdefault("verify_timeout_s", 10)
    return Tunnel(TunnelConfig(origin.url, **settings), api_key=api_key, on_event=on_event,
                  command=COMMAND, env=standin.env(mode, **(standin_env or {})),
                  resolve=resolve or standin.resolve)


# -- pure pieces -----------------------------------------------------------------------------

@pytest.mark.parametrize("url, requested, expected_cap, warned", [
    ("https://abc-def.trycloudflare.com", 256, 100, True),
    ("https://abc-def.trycloudflare.com/", 64, 64, False),
    ("https://app.example.com", 256, 256, False),
    ("https://trycloudflare.com.evil.example", 256, 256, False),
    ("abc.trycloudflare.com", 101, 100, True),
])
def test_concurrency_cap_only_lowers_quick_tunnels(url, requested, expected_cap, warned):
    cap, warning = concurrency_cap(url, requested)
    assert cap == expected_cap
    assert (warning is not None) == warned
    if warned:
        assert "quick tunnel" in warning and str(requested) in warning
    assert is_quick_tunnel(url) == ("trycloudflare.com" in url and "evil" not in url)


@pytest.mark.parametrize("system, release, expected", [
    ("Darwin", {}, "brew install cloudflared"),
    ("Windows", {}, "winget install --id Cloudflare.cloudflared"),
    ("Linux", {"ID": "ubuntu", "ID_LIKE": "debian"}, "cloudflared-linux-amd64.deb"),
    ("Linux", {"ID": "fedora"}, "yum install cloudflared"),
])
def test_install_hint_names_the_command_for_the_os(system, release, expected):
    hint = install_hint(system, release, machine="x86_64")
    assert expected in hint and "CLOUDFLARED_PATH" in hint
    assert "[" not in hint  # the CLI renders hints as rich markup


def test_find_cloudflared_prefers_cloudflared_path_then_path(tmp_path):
    assert find_cloudflared({"CLOUDFLARED_PATH": str(STANDIN), "PATH": ""}) == str(STANDIN)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "cloudflared").symlink_to(STANDIN)
    assert find_cloudflared({"PATH": str(bindir)}) == str(bindir / "cloudflared")

    with pytest.raises(CloudflaredNotFoundError) as missing:
        find_cloudflared({"PATH": str(tmp_path)})
    assert "not found on PATH" in missing.value.message
    assert "install cloudflared" in missing.value.hint

    plain = tmp_path / "not-executable"
    plain.write_text("#!/bin/sh\n")
    plain.chmod(stat.S_IRUSR | stat.S_IWUSR)
    with pytest.raises(CloudflaredNotFoundError, match="is not an executable file"):
        find_cloudflared({"CLOUDFLARED_PATH": str(plain)})
    with pytest.raises(CloudflaredNotFoundError, match="does not exist"):
        find_cloudflared({"CLOUDFLARED_PATH": str(tmp_path / "nope")})


def test_parse_counters_sums_label_sets_and_ignores_the_rest():
    text = ("# HELP cloudflared_tunnel_total_requests x\n"
            "cloudflared_tunnel_total_requests 7\n"
            'cloudflared_tunnel_request_errors{origin="a"} 1\n'
            'cloudflared_tunnel_request_errors{origin="b"} 2\n'
            "go_goroutines 40\n")
    assert parse_counters(text) == {"requests": 7.0, "errors": 3.0}


def test_config_validates_named_tunnels_and_hides_the_token():
    token = make_token()
    with pytest.raises(UsageError, match="'sideways' is not quick or named"):
        TunnelConfig("http://127.0.0.1:8001", mode="sideways")
    with pytest.raises(UsageError, match="needs its token"):
        TunnelConfig("http://127.0.0.1:8001", mode="named", hostname="a.example.com")
    with pytest.raises(UsageError, match="public hostname"):
        TunnelConfig("http://127.0.0.1:8001", mode="named", token=token)
    with pytest.raises(UsageError, match="has no scheme"):
        TunnelConfig("127.0.0.1:8001")
    config = TunnelConfig("http://127.0.0.1:8001/", mode="named", token=token,
                          hostname="https://a.example.com/")
    assert token not in repr(config) and "****" in repr(config)
    assert config.origin_url == "http://127.0.0.1:8001" and config.hostname == "a.example.com"
    assert config.for_origin("http://127.0.0.1:9").token == token
    with pytest.raises(UsageError, match="has no scheme"):
        config.for_origin("127.0.0.1:9")


def test_a_tunnel_needs_an_origin():
    with pytest.raises(UsageError, match="no origin"):
        Tunnel(TunnelConfig())


def test_orphan_guard_is_validated_up_front():
    with pytest.raises(UsageError, match="orphan_guard 'bogus' is not one of auto"):
        TunnelConfig("http://127.0.0.1:8001", orphan_guard="bogus")


def test_metrics_client_reports_no_numbers_once_closed():
    metrics = MetricsClient("127.0.0.1:9")
    assert metrics.counters() == {}  # nothing listening
    metrics.close()
    assert metrics.counters() == {}  # closed: a restart retired it under a status loop


def test_process_keeps_a_bounded_redacted_log_and_stops_a_silent_child():
    secret = "tok_" + "s3cr3t" * 4
    script = f"import sys\nfor i in range(500): print('line', i, {secret!r}, flush=True)\n"
    with TunnelProcess([sys.executable, "-c", script], secrets=[secret], log_lines=50) as proc:
        proc.wait(10)
        deadline = time.monotonic() + 5
        while not proc.logs() or "line 499" not in proc.logs()[-1]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    lines = proc.logs()
    assert len(lines) == 50 and lines[0].startswith("line 450")
    assert all(secret not in line and "****" in line for line in lines)

    silent = TunnelProcess([sys.executable, "-c", "import time; time.sleep(60)"]).start()
    started = time.monotonic()
    silent.stop(timeout_s=2)
    assert time.monotonic() - started < 4 and not silent.alive and silent.logs() == []


def test_an_exited_childs_last_lines_are_in_its_logs_at_once():
    # The reader is held after the first line while the child writes its last one and
    # exits: asked right after the exit, the logs must hold it (an exit error quoted the
    # logs, found nothing, and said cloudflared logged nothing).
    def slow_reader(line):
        if line == "first":
            time.sleep(0.5)

    script = "print('first', flush=True); print('last words', flush=True)"
    with TunnelProcess([sys.executable, "-c", script], on_line=slow_reader) as proc:
        assert proc.wait(10) == 0
        assert proc.logs() == ["first", "last words"]


def test_an_on_line_callback_may_read_the_logs_after_the_exit():
    seen = []

    def on_line(line):  # runs on the reader thread, which must not wait for itself
        deadline = time.monotonic() + 5
        while proc.returncode is None and time.monotonic() < deadline:
            time.sleep(0.01)
        seen.append(proc.logs())

    script = "print('a', flush=True); print('b', flush=True)"
    with TunnelProcess([sys.executable, "-c", script], on_line=on_line) as proc:
        assert proc.wait(10) == 0
        assert proc.logs() == ["a", "b"]
    assert seen == [["a"], ["a", "b"]]


def test_process_env_is_set_on_top_of_the_inherited_environment():
    script = "import os; print(os.environ.get('TUNNEL_EXTRA'), 'PATH' in os.environ)"
    with TunnelProcess([sys.executable, "-c", script], env={"TUNNEL_EXTRA": "yes"}) as proc:
        assert proc.wait(10) == 0
        deadline = time.monotonic() + 5
        while not proc.logs():
            assert time.monotonic() < deadline
            time.sleep(0.01)
    assert proc.logs() == ["yes True"]


# -- startup paths through the stand-in ------------------------------------------------------

def test_quick_tunnel_reaches_the_app_through_the_forwarder(standin, math_server, api_key):
    events = []
    with open_tunnel(standin, math_server, api_key, on_event=events.append) as t:
        assert is_quick_tunnel(t.url) and t.url.startswith("https://")
        [launch] = standin.launches()
        argv = launch["argv"]
        assert argv[:2] == ["tunnel", "--no-autoupdate"]
        assert argv[argv.index("--config") + 1] == os.devnull
        assert argv[argv.index("--url") + 1] == math_server.url
        assert argv[argv.index("--metrics") + 1].startswith("127.0.0.1:")
        assert launch["hostname"] == t.hostname

        public = standin.resolve(t.url)
        resp = httpx.get(public + "/task_info", params={"seed": 3},
                         headers={"X-API-Key": api_key}, timeout=5)
        assert resp.status_code == 200 and resp.headers["cf-ray"]
        assert httpx.get(public + "/health", timeout=5).status_code == 401
        counters = t.counters()
        assert counters["requests"] >= 3 and counters["connections"] >= 1
        assert any("Registered tunnel connection connIndex=0" in line for line in t.logs())
        pid = t.process.pid
    assert [e.kind for e in events] == ["ready"]
    assert wait_gone([pid]) == []
    assert t.process.returncode == 0  # SIGTERM: a graceful stop


def test_retries_through_530_and_dns_propagation(standin, math_server, api_key):
    calls = []

    def slow_dns(url: str) -> str:
        calls.append(url)
        return "http://127.0.0.1:9" if len(calls) == 1 else standin.resolve(url)

    with open_tunnel(standin, math_server, api_key, standin_env={"edge_530": 1},
                     resolve=slow_dns) as t:
        assert t.url and len(calls) >= 3  # unresolved, answered 530, then healthy
        assert t.counters()["requests"] >= 2


def test_verification_stops_at_a_definitive_failure(standin, math_server):
    started = time.monotonic()
    with pytest.raises(TunnelError) as err:
        open_tunnel(standin, math_server, "sk_env_not_the_key_0000", verify_timeout_s=30).start()
    assert time.monotonic() - started < 10  # did not wait out the 30 s
    assert "did not answer healthy" in err.value.message and "refused" in err.value.message
    assert wait_gone(standin.pids()) == []


def test_exit_early_raises_with_cloudflareds_last_lines(standin, math_server, api_key):
    with pytest.raises(TunnelError) as err:
        open_tunnel(standin, math_server, api_key, mode="exit-early").start()
    assert not isinstance(err.value, TunnelRateLimitedError)
    assert "exited with code 1" in err.value.message and "no such host" in err.value.message
    assert any("failed to request quick Tunnel" in line for line in err.value.logs)


def test_rate_limit_is_named(standin, math_server, api_key):
    with pytest.raises(TunnelRateLimitedError) as err:
        open_tunnel(standin, math_server, api_key, mode="rate-limit").start()
    assert "429" in err.value.message and "named tunnel" in err.value.hint
    assert any("429 Too Many Requests" in line for line in err.value.logs)


@pytest.mark.parametrize("mode, says", [
    ("never-ready", "did not register a connection to Cloudflare's edge (ready=0)"),
    ("hang", "did not open its metrics server within 1s and logged nothing"),
])
def test_startup_timeout_fires_and_kills_the_child(standin, math_server, api_key, mode, says):
    started = time.monotonic()
    with pytest.raises(TunnelError) as err:
        open_tunnel(standin, math_server, api_key, mode=mode, start_timeout_s=1).start()
    assert 0.9 < time.monotonic() - started < 5
    assert says in err.value.message
    assert wait_gone(standin.pids()) == []


def test_a_dead_cloudflared_is_restarted_with_a_new_url(standin, math_server, api_key):
    events = []
    restarted = threading.Event()

    def on_event(event):
        events.append(event)
        if event.kind == "restarted":
            restarted.set()

    with open_tunnel(standin, math_server, api_key, mode="dies,ok",
                     on_event=on_event) as t:
        first = t.url
        standin.crash(1)
        assert restarted.wait(15), [e.kind for e in events]
        assert [e.kind for e in events] == ["ready", "died", "restarting", "restarted"]
        assert t.url != first and events[-1].url == t.url and t.restarts == 1
        assert "code 1" in events[1].message
        assert any("connection with edge closed" in line for line in events[1].logs)
        resp = httpx.get(standin.resolve(t.url) + "/health", headers={"X-API-Key": api_key},
                         timeout=5)
        assert resp.status_code == 200
    assert wait_gone(standin.pids()) == []


def test_restarts_are_bounded(standin, math_server, api_key):
    failed = threading.Event()
    events = []

    def on_event(event):
        events.append(event)
        if event.kind == "failed":
            failed.set()

    with open_tunnel(standin, math_server, api_key, mode="dies,exit-early",
                     max_restarts=1, on_event=on_event) as t:
        standin.crash(1)
        assert failed.wait(15)
        assert isinstance(t.error, TunnelError) and not t.alive
        assert "1 restart(s)" in t.error.message
    kinds = [e.kind for e in events]
    assert kinds == ["ready", "died", "restarting", "died", "failed"]
    assert len(standin.launches()) == 2
    assert wait_gone(standin.pids()) == []


def test_an_unexpected_error_while_starting_is_raised_as_a_tunnel_error(standin, math_server,
                                                                       api_key):
    def broken_resolve(url: str) -> str:
        raise LookupError("resolver bug")

    with pytest.raises(TunnelError) as err:
        open_tunnel(standin, math_server, api_key, resolve=broken_resolve).start()
    assert "LookupError: resolver bug" in err.value.message
    assert isinstance(err.value.__cause__, LookupError)
    assert any("Registered tunnel connection" in line for line in err.value.logs)
    assert wait_gone(standin.pids()) == []


def test_an_unexpected_error_during_a_restart_fails_the_tunnel(standin, math_server, api_key):
    failed = threading.Event()
    events = []
    hosts: list[str] = []

    def on_event(event):
        events.append(event)
        if event.kind == "failed":
            failed.set()

    def resolve(url: str) -> str:
        if urlsplit(url).hostname not in hosts:
            hosts.append(urlsplit(url).hostname)
        if len(hosts) > 1:
            raise LookupError("resolver bug")
        return standin.resolve(url)

    with open_tunnel(standin, math_server, api_key, mode="dies,ok", resolve=resolve,
                     on_event=on_event) as t:
        standin.crash(1)
        assert failed.wait(10), [e.kind for e in events]
        assert isinstance(t.error, TunnelError) and not t.alive
        assert isinstance(t.error.__cause__, LookupError)
        assert "LookupError: resolver bug" in t.error.message
        assert events[-1].message == t.error.message
    assert [e.kind for e in events] == ["ready", "died", "restarting", "failed"]
    assert wait_gone(standin.pids()) == []


def test_counters_survive_a_restart_retiring_the_metrics_client(standin, math_server, api_key):
    """The status loop reads counters() while the supervisor swaps clients: pause the reader
    between taking the old client and using it until the restart has closed that client."""
    hosts: list[str] = []
    relaunch_verifying, reader_paused, restarted = (threading.Event() for _ in range(3))

    def resolve(url: str) -> str:
        if urlsplit(url).hostname not in hosts:
            hosts.append(urlsplit(url).hostname)
        if len(hosts) == 2 and not relaunch_verifying.is_set():
            relaunch_verifying.set()  # the new child is up; the old client is still current
            reader_paused.wait(5)
        return standin.resolve(url)

    def on_event(event):
        if event.kind == "restarted":
            restarted.set()

    def pause_at_alive(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "alive" and not reader_paused.is_set():
            reader_paused.set()
            restarted.wait(10)

    with open_tunnel(standin, math_server, api_key, mode="dies,ok", resolve=resolve,
                     on_event=on_event) as t:
        standin.crash(1)
        assert relaunch_verifying.wait(15)
        sys.setprofile(pause_at_alive)
        try:
            counters = t.counters()
        finally:
            sys.setprofile(None)
        assert reader_paused.is_set() and restarted.is_set() and counters == {}
        assert t.counters()["connections"] >= 1  # the new client answers


# -- named tunnels ---------------------------------------------------------------------------

def test_named_tunnel_passes_the_token_by_environment_only(standin, math_server, api_key):
    token = make_token()
    env = standin.env("ok", hostname="tasks.example.test", origin=math_server.url)
    config = TunnelConfig(math_server.url, mode="named", token=token,
                          hostname="tasks.example.test", verify_timeout_s=10)
    with Tunnel(config, api_key=api_key, command=COMMAND, env=env,
                resolve=standin.resolve) as t:
        assert t.url == "https://tasks.example.test"
        [launch] = standin.launches()
        assert launch["argv"][-1] == "run" and launch["token_env"] is True
        assert token not in " ".join(launch["argv"]) and token not in repr(t)
        resp = httpx.get(standin.resolve(t.url) + "/health", headers={"X-API-Key": api_key},
                         timeout=5)
        assert resp.status_code == 200


def test_named_tunnel_with_a_bad_token_fails_without_echoing_it(standin, math_server, api_key):
    token = "not-a-real-token-value-123"
    with pytest.raises(TunnelError) as err:
        Tunnel(TunnelConfig(math_server.url, mode="named", token=token,
                            hostname="t.example.test"),
               api_key=api_key, command=COMMAND, env=standin.env("ok")).start()
    assert "Provided Tunnel token is not valid" in err.value.message
    assert token not in str(err.value) and all(token not in line for line in err.value.logs)


# -- expose(): serve + tunnel + .env ---------------------------------------------------------

def test_expose_serves_the_app_writes_env_and_counts(standin, tmp_path, api_key, mock_policy):
    env_file = tmp_path / ".env"
    env_file.write_text(f"ENVIRONMENT_API_KEY={api_key}\nOTHER=kept\n")
    env = load_env([env_file])
    runner = LocalRunner(ServeSettings(app="math", env=env, keys=server_keys(env, "required")))
    with expose(runner, TunnelConfig(verify_timeout_s=10), write_env=env_file,
                command=COMMAND, env=standin.env("ok"), resolve=standin.resolve) as exposed:
        assert exposed.app_id == "math" and exposed.local_url.startswith("http://127.0.0.1:")
        assert env_file.read_text() == (f"ENVIRONMENT_API_KEY={api_key}\nOTHER=kept\n"
                                        f"TASK_APP_URL={exposed.url}\n")
        assert any("quick tunnels allow about 200" in w for w in exposed.warnings)
        before = exposed.stats()
        resp = httpx.post(standin.resolve(exposed.url) + "/rollout", timeout=20,
                          headers={"X-API-Key": api_key}, json={
                              "run_id": "tunnel-1", "env": {"seed": 1},
                              "policy": {"config": {"model": "m",
                                                    "inference_url": mock_policy.url + "/v1"}}})
        assert resp.status_code == 200, resp.text
        after = exposed.stats()
        assert after["rollouts"] == before["rollouts"] + 1
        assert after["rollout_requests"] == before["rollout_requests"] + 1
        assert after["requests"] >= before["requests"] + 1 and after["uptime_s"] > 0
        local = exposed.local_url
        assert os.environ["OTHER"] == "kept"  # exported for the app while it runs...
    assert "OTHER" not in os.environ  # ...and not after
    with pytest.raises(httpx.ConnectError):
        httpx.get(local + "/", timeout=2)  # the local server stopped with the block
    assert wait_gone(standin.pids()) == []


def test_tunnel_fails_fast_without_a_binary_or_a_key(tmp_path, api_key):
    env_file = tmp_path / ".env"
    env_file.write_text(f"ENVIRONMENT_API_KEY={api_key}\nPATH={tmp_path}\n")
    result = run_cli(tmp_path, "tunnel", "math", "--env-file", str(env_file), timeout=30)
    assert result.returncode != 0 and "cloudflared was not found" in result.stderr
    no_key = tmp_path / "nokey.env"
    no_key.write_text(f"CLOUDFLARED_PATH={STANDIN}\nENVIRONMENT_API_KEY=\n")
    result = run_cli(tmp_path, "tunnel", "math", "--env-file", str(no_key), timeout=30)
    assert result.returncode == 2 and "no ENVIRONMENT_API_KEY" in result.stderr
    assert "Traceback" not in result.stderr
