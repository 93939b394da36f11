"""The health checker against real local servers that really misbehave, one way each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from standins.health_servers import (
    SelfSignedTLSServer,
    StallServer,
    auth_off,
    break_task_info,
    closed_port,
    cloudflare_530_app,
    cold_start,
    modal_303,
    rewrite_task_info,
    self_signed_cert,
    slow,
    status_app,
    synth_ai_auth,
    synth_ai_style,
)

from synth_deploy.env import fingerprint
from synth_deploy.errors import UsageError
from synth_deploy.health import (
    STEPS,
    CheckOptions,
    CheckResult,
    HealthReport,
    RolloutOptions,
    check,
    wait_until_healthy,
)
from synth_deploy.serving import create_app


def verdicts(report: HealthReport) -> dict[str, str]:
    return {c.name: c.verdict for c in report.checks}


def by_name(report: HealthReport, name: str) -> CheckResult:
    result = report.get(name)
    assert result is not None, f"no {name} check in {verdicts(report)}"
    return result


def assert_no_secret(report: HealthReport, *secrets: str) -> None:
    text = json.dumps(report.to_dict())
    for secret in secrets:
        assert secret not in text


# --- healthy ---------------------------------------------------------------------------


def test_healthy_app_passes_every_step_in_order(math_server, api_key):
    report = check(math_server.url, api_key, CheckOptions(seeds=range(5)), key_source="test")
    assert report.healthy and report.exit_code == 0 and report.failure is None
    assert [c.name for c in report.checks] == list(STEPS)
    assert verdicts(report) == {"url": "pass", "dns": "pass", "tcp": "pass", "tls": "skip",
                                "root": "pass", "health": "pass", "auth": "pass",
                                "info": "pass", "task_info": "pass", "task_info_seeds": "pass",
                                "rollout": "skip"}
    assert "5 valid TaskInfo" in by_name(report, "task_info_seeds").actual
    assert "401" in by_name(report, "auth").actual and "403" in by_name(report, "auth").actual
    assert all(c.latency_ms is not None for c in report.checks if c.verdict == "pass"
               and c.name != "url")
    data = report.to_dict()
    assert data["key"] == {"source": "test", "fingerprint": f"sha256:{fingerprint(api_key)}"}
    assert_no_secret(report, api_key)


def test_rollout_in_eval_mode_through_the_mock_policy(math_server, mock_policy, api_key):
    rollout = RolloutOptions(mock_policy.url + "/v1", model="mock")
    report = check(math_server.url, api_key, CheckOptions(rollout=rollout))
    rollout = by_name(report, "rollout")
    assert rollout.verdict == "pass", rollout
    assert "reward_mean=" in rollout.actual and report.exit_code == 0


def test_rollout_failing_inside_the_app_is_explained(math_server, api_key):
    dead = f"http://127.0.0.1:{closed_port()}/v1"
    report = check(math_server.url, api_key, CheckOptions(rollout=RolloutOptions(dead, "m")))
    rollout = by_name(report, "rollout")
    assert rollout.verdict == "fail" and rollout.code == "policy_failed"
    assert "inference URL" in rollout.hint
    assert report.exit_code == 1 and report.failure is rollout


def test_rollout_without_inference_url_is_a_usage_error():
    with pytest.raises(UsageError, match="inference URL"):
        RolloutOptions("")


@pytest.mark.parametrize("options", [dict(seeds=[]), dict(timeout_s=0), dict(timeout_s=-1)])
def test_options_that_cannot_work_are_usage_errors(options):
    with pytest.raises(UsageError):
        CheckOptions(**options)


def test_options_keep_seeds_as_a_tuple_and_compare_by_value():
    options = CheckOptions(seeds=range(3), timeout_s=5)
    assert options.seeds == (0, 1, 2)
    assert options == CheckOptions(seeds=[0, 1, 2], timeout_s=5)


# --- auth ------------------------------------------------------------------------------


def test_app_with_auth_off_fails_as_open_to_anyone(serve, math_config, api_key):
    server = serve(auth_off(create_app(math_config, api_keys=[api_key]), api_key))
    report = check(server.url, api_key)
    auth = by_name(report, "auth")
    assert auth.verdict == "fail" and auth.code == "open_to_anyone"
    assert "open to anyone" in auth.hint and "no key → 200" in auth.actual
    assert "/rollout without key → 422" in auth.actual and "/rollout without key" in auth.hint
    assert by_name(report, "info").verdict == "pass"  # the rest still ran
    assert report.exit_code == 1 and not report.healthy


def test_wrong_key_is_a_key_mismatch_with_fingerprint_not_key(math_server, api_key):
    wrong = "sk_env_wrong_but_plausible_0123456789"
    report = check(math_server.url, wrong, key_source="ENVIRONMENT_API_KEY from .env")
    health = by_name(report, "health")
    assert health.verdict == "fail" and health.code == "key_mismatch"
    assert "ENVIRONMENT_API_KEY from .env" in health.hint
    assert fingerprint(wrong) in health.hint
    assert by_name(report, "auth").verdict == "pass"
    assert by_name(report, "info").verdict == "skip"
    assert report.exit_code == 1
    assert_no_secret(report, wrong, api_key)


def test_no_key_given(math_server):
    report = check(math_server.url, None)
    health = by_name(report, "health")
    assert health.code == "no_key" and "ENVIRONMENT_API_KEY" in health.hint
    assert report.exit_code == 1 and report.to_dict()["key"]["fingerprint"] is None


def test_server_without_a_key_configured(serve, math_config, api_key):
    server = serve(create_app(math_config, api_keys=[]))
    report = check(server.url, api_key)
    health = by_name(report, "health")
    assert health.code == "server_key_missing" and "server's environment" in health.hint
    assert report.exit_code == 1


def test_synth_ai_400_is_a_key_mismatch_and_a_leak_without_echoing_it(serve, math_config,
                                                                     api_key):
    server = serve(synth_ai_auth(create_app(math_config, api_keys=[api_key]), api_key))
    wrong = "sk_env_other_key_" + "x" * 20
    report = check(server.url, wrong)
    health = by_name(report, "health")
    assert health.code == "key_mismatch" and "synth-ai" in health.actual
    auth = by_name(report, "auth")
    assert auth.verdict == "warn" and auth.code == "key_leak"
    assert "allowed_first15" in auth.hint
    assert_no_secret(report, api_key[:15], wrong[:15])

    good = check(server.url, api_key)
    assert good.healthy and good.exit_code == 0
    assert by_name(good, "auth").code == "key_leak"
    assert_no_secret(good, api_key[:15])


@pytest.mark.parametrize("health_without_key", ["authorized", "prefix"])
def test_a_synth_ai_style_app_is_healthy(serve, math_config, api_key, health_without_key):
    # Its /health answers anyone (issue 38); synth-ai's own health checks accept it: so must
    # we, judging who may run rollouts by /rollout. Its key material is still a warning.
    server = serve(synth_ai_style(create_app(math_config, api_keys=[api_key]), api_key,
                                  health_without_key=health_without_key))
    report = check(server.url, api_key)
    assert report.healthy and report.exit_code == 0, report.summary()
    assert by_name(report, "health").verdict == "pass"
    auth = by_name(report, "auth")
    assert (auth.verdict, auth.code) == ("warn", "key_leak")
    assert "no key → 200" in auth.actual and "/rollout with a wrong key → 400" in auth.actual
    assert_no_secret(report, api_key[:15])


def test_a_synth_ai_style_app_saying_the_key_is_not_authorized_is_a_key_mismatch(
        serve, math_config, api_key):
    server = serve(synth_ai_style(create_app(math_config, api_keys=[api_key]), api_key,
                                  health_without_key="prefix"))
    wrong = "sk_env_other_key_" + "x" * 20
    report = check(server.url, wrong)
    health = by_name(report, "health")
    assert (health.verdict, health.code) == ("fail", "key_mismatch")
    assert "not authorized" in health.actual and fingerprint(wrong) in health.hint
    assert by_name(report, "info").verdict == "skip" and report.exit_code == 1
    assert_no_secret(report, api_key[:15], wrong[:15])


# --- gateways and network -------------------------------------------------------------


def test_cloudflare_530_means_the_tunnel_origin_is_down(serve, api_key):
    server = serve(cloudflare_530_app())
    report = check(server.url, api_key)
    root = by_name(report, "root")
    assert root.verdict == "fail" and root.code == "cloudflare_530"
    assert "1033" in root.actual and "cloudflared" in root.hint
    assert by_name(report, "health").verdict == "skip"
    assert report.exit_code == 1


@pytest.mark.parametrize(("status", "code", "words"), [
    (524, "proxy_timeout", "send its 200 head, sooner"),
    (503, "unavailable", "--wait"),
    (502, "bad_gateway", "crashed"),
    (504, "gateway_timeout", "gave up waiting"),
])
def test_gateway_statuses(serve, api_key, status, code, words):
    server = serve(status_app(status, "upstream trouble"))
    report = check(server.url, api_key)
    root = by_name(report, "root")
    assert (root.verdict, root.code) == ("fail", code)
    assert words in root.hint and str(status) in root.actual
    assert report.exit_code == 1


def test_a_connection_cut_after_checks_passed_blames_the_path_not_the_port(math_server,
                                                                           api_key,
                                                                           monkeypatch):
    # A proxy with a short limit cuts the rollout, whose policy never answers: the port and
    # scheme answered nine checks, so "is it the right port?" sent the user the wrong way.
    # The app is taken for one without async rollouts (whose polls no proxy cuts): a
    # synth-ai app's single POST /rollout is what such a proxy cuts.
    from standins.silence_proxy import SilenceCuttingProxy

    monkeypatch.setattr("synth_deploy.serving.containers.advertises_async",
                        lambda document: False)

    with StallServer() as policy, SilenceCuttingProxy(
            "127.0.0.1", int(math_server.url.rsplit(":", 1)[1]), silence_s=1.0) as proxy:
        rollout = RolloutOptions(f"http://127.0.0.1:{policy.port}/v1", "m", timeout_s=20)
        report = check(proxy.url, api_key, CheckOptions(rollout=rollout, timeout_s=5))
        assert proxy.cut >= 1
    cut = by_name(report, "rollout")
    assert (cut.verdict, cut.code) == ("fail", "connection_cut"), cut
    assert "host, port and scheme are right" in cut.hint and "proxy" in cut.hint
    assert "right port" not in cut.hint


def test_stalled_server_times_out_within_the_bound(api_key):
    with StallServer() as stall:
        started = time.monotonic()
        report = check(f"http://127.0.0.1:{stall.port}", api_key, CheckOptions(timeout_s=0.3))
        elapsed = time.monotonic() - started
    assert by_name(report, "tcp").verdict == "pass"
    root = by_name(report, "root")
    assert (root.verdict, root.code) == ("fail", "timeout")
    assert "stuck" in root.hint and report.exit_code == 1
    assert elapsed < 3


def test_closed_port_is_unreachable(api_key):
    port = closed_port()
    report = check(f"http://127.0.0.1:{port}", api_key)
    tcp = by_name(report, "tcp")
    assert (tcp.verdict, tcp.code) == ("fail", "connection_refused")
    assert f"--port {port}" in tcp.hint
    assert report.exit_code == 3
    assert all(c.verdict == "skip" for c in report.checks[report.checks.index(tcp) + 1:])


def test_name_that_does_not_resolve(api_key):
    report = check("https://synth-deploy-check.invalid", api_key, CheckOptions(timeout_s=5))
    dns = by_name(report, "dns")
    assert (dns.verdict, dns.code) == ("fail", "dns_unresolved")
    assert "typo" in dns.hint and "--wait" in dns.hint
    assert report.exit_code == 3


def test_self_signed_certificate_fails_tls(tmp_path, api_key):
    certfile, keyfile = self_signed_cert(tmp_path)
    with SelfSignedTLSServer(certfile, keyfile) as server:
        report = check(server.url, api_key, CheckOptions(timeout_s=3))
    tls = by_name(report, "tls")
    assert (tls.verdict, tls.code) == ("fail", "tls_error")
    assert "self-signed" in tls.actual or "self signed" in tls.actual
    assert "self-signed" in tls.hint
    assert report.exit_code == 3


def test_a_certificate_trusted_through_ssl_cert_file_passes_tls(tmp_path, api_key,
                                                               monkeypatch):
    # A company's own CA, trusted as httpx trusts it (and so every other command of the kit).
    certfile, keyfile = self_signed_cert(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(certfile))
    with SelfSignedTLSServer(certfile, keyfile) as server:
        report = check(server.url, api_key, CheckOptions(timeout_s=3))
    tls = by_name(report, "tls")
    assert tls.verdict == "pass", tls


def test_https_to_a_plain_http_server(math_server, api_key):
    report = check(f"https://127.0.0.1:{math_server.port}", api_key, CheckOptions(timeout_s=3))
    tls = by_name(report, "tls")
    assert tls.code == "tls_error" and "http://" in tls.hint
    assert report.exit_code == 3


# --- protocol shapes -----------------------------------------------------------------


def test_task_info_breaking_the_schema_names_the_field(serve, math_config, api_key):
    server = serve(rewrite_task_info(create_app(math_config, api_keys=[api_key]),
                                     break_task_info))
    report = check(server.url, api_key, CheckOptions(seeds=[3]))
    seeds = by_name(report, "task_info_seeds")
    assert (seeds.verdict, seeds.code) == ("fail", "schema_mismatch")
    assert seeds.expected.startswith("task.name:") and "missing" in seeds.actual
    assert "(+1 more)" in seeds.actual
    assert "/task_info?seed=3" in seeds.hint
    assert by_name(report, "task_info").verdict == "pass"
    assert report.exit_code == 1


def test_task_info_wrong_type_reports_expected_and_actual(serve, math_config, api_key):
    def only_bad_type(item):
        item.setdefault("limits", {})["max_turns"] = "many"

    server = serve(rewrite_task_info(create_app(math_config, api_keys=[api_key]),
                                     only_bad_type))
    seeds = by_name(check(server.url, api_key), "task_info_seeds")
    assert seeds.expected == "limits.max_turns: a valid integer, unable to parse string as an " \
                             "integer"
    assert seeds.actual == "limits.max_turns: 'many'"


def test_modal_303_redirects_are_followed(serve, math_config, mock_policy, api_key):
    server = serve(modal_303(create_app(math_config, api_keys=[api_key])))
    rollout = RolloutOptions(mock_policy.url + "/v1")
    report = check(server.url, api_key, CheckOptions(rollout=rollout))
    assert report.healthy, report.summary()
    assert "303" in by_name(report, "root").actual
    assert by_name(report, "rollout").verdict == "pass"


def test_wrong_base_url(math_server, api_key):
    report = check(math_server.url + "/api", api_key)
    assert by_name(report, "root").verdict == "warn"
    health = by_name(report, "health")
    assert (health.verdict, health.code) == ("fail", "wrong_base_url")
    assert "base URL" in health.hint and report.exit_code == 1


def test_slow_answers_pass_with_a_warning(serve, math_config, api_key):
    server = serve(slow(create_app(math_config, api_keys=[api_key]), 0.12))
    report = check(server.url, api_key, CheckOptions(slow_s=0.05))
    root = by_name(report, "root")
    assert (root.verdict, root.code) == ("warn", "slow") and "cold start" in root.hint
    assert report.healthy and report.exit_code == 0


@pytest.mark.parametrize(("url", "code", "words"), [
    ("http://127.0.0.1:8001/health", "endpoint_in_url", "http://127.0.0.1:8001"),
    ("https://app.modal.run/api/task_info/", "endpoint_in_url", "https://app.modal.run/api"),
    ("my-app.modal.run", "no_scheme", "https://my-app.modal.run"),
    ("localhost:8001", "no_scheme", "https://localhost:8001"),
    ("ftp://example.com", "bad_scheme", "http://"),
    ("http://", "no_host", "HOST"),
    ("http://127.0.0.1:99999", "bad_port", "65535"),
    ("http://127.0.0.1:8001/?x=1", "query_in_url", "http://127.0.0.1:8001"),
    ("", "invalid_url", "URL"),
])
def test_unusable_urls_are_usage_errors(url, code, words):
    report = check(url)
    first = report.checks[0]
    assert (first.name, first.verdict, first.code) == ("url", "fail", code)
    assert words in first.hint
    assert report.exit_code == 2
    assert all(c.verdict == "skip" for c in report.checks[1:])


def test_plain_http_to_a_remote_host_warns():
    report = check("http://synth-deploy-check.invalid")
    url = by_name(report, "url")
    assert (url.verdict, url.code) == ("warn", "insecure_http")


# --- waiting ------------------------------------------------------------------------


def test_wait_until_healthy_rides_out_a_cold_start(serve, math_config, api_key):
    server = serve(cold_start(create_app(math_config, api_keys=[api_key]), 0.5))
    attempts: list[tuple[int, bool]] = []
    report = wait_until_healthy(server.url, api_key, timeout_s=10, interval_s=0.1,
                                on_attempt=lambda n, r: attempts.append((n, r.healthy)))
    assert report.healthy
    assert attempts[0] == (1, False) and attempts[-1][1] is True and len(attempts) >= 2
    assert [n for n, _ in attempts] == list(range(1, len(attempts) + 1))


def test_wait_until_healthy_gives_up_on_time(api_key):
    url = f"http://127.0.0.1:{closed_port()}"
    calls: list[int] = []
    started = time.monotonic()
    report = wait_until_healthy(url, api_key, timeout_s=0.6, interval_s=0.1,
                                on_attempt=lambda n, r: calls.append(n))
    elapsed = time.monotonic() - started
    assert not report.healthy and report.exit_code == 3
    assert len(calls) >= 2 and 0.5 <= elapsed < 3


def test_wait_until_healthy_does_not_retry_a_bad_url():
    calls: list[int] = []
    report = wait_until_healthy("http://127.0.0.1:1/health", timeout_s=5,
                                on_attempt=lambda n, r: calls.append(n))
    assert report.exit_code == 2 and calls == [1]


# --- import cost ----------------------------------------------------------------------


def test_check_loads_no_server_stack(math_server, api_key):
    code = (
        "import sys\n"
        "from synth_deploy.health import CheckOptions, check\n"
        f"report = check({math_server.url!r}, {api_key!r}, CheckOptions(seeds=[0, 1]))\n"
        "heavy = [m for m in ('fastapi', 'uvicorn', 'starlette', 'modal', 'libsql', 'httpx')"
        " if m in sys.modules]\n"
        "print(report.exit_code, heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.strip()
    assert out == "0 []"


def test_the_library_never_reads_the_key_from_the_environment(math_server, api_key, tmp_path):
    # The caller resolves the key (the CLI does); a key in the environment or ./.env is unused.
    (tmp_path / ".env").write_text(f"ENVIRONMENT_API_KEY={api_key}\n")
    code = ("from synth_deploy.health import check\n"
            f"print(check({math_server.url!r}).get('health').code)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True, cwd=tmp_path,
                         env={**os.environ, "ENVIRONMENT_API_KEY": api_key}).stdout.strip()
    assert out == "no_key"


def test_a_malformed_url_is_a_usage_error_not_a_traceback():
    report = check("http://[::1")
    assert report.exit_code == 2 and report.failure.name == "url"
    assert "not a URL" in report.failure.actual
