"""Where spans go: the standard OTEL_* variables read as the SDK reads them, the export
command's flags, and the errors either gives for a value that cannot work."""

from __future__ import annotations

import subprocess
import sys

import pytest
from processes import clean_env, run_cli

from synth_deploy.env import Env
from synth_deploy.errors import UsageError
from synth_deploy.otel import otlp_setting, otlp_setting_from_env
from synth_deploy.serving import LocalRunner, ServeSettings, server_keys

SECRET = "hc_live_0123456789abcdef"


def test_no_endpoint_or_turned_off_is_no_live_export():
    assert otlp_setting_from_env(Env()) is None
    on = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert otlp_setting_from_env(Env({**on, "OTEL_SDK_DISABLED": "true"})) is None
    assert otlp_setting_from_env(Env({**on, "OTEL_TRACES_EXPORTER": "none"})) is None


def test_the_standard_variables_as_the_sdk_reads_them():
    base = otlp_setting_from_env(Env({
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318/",
        "OTEL_EXPORTER_OTLP_HEADERS": f"x-honeycomb-team={SECRET},x-tenant=a%20b",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "3", "OTEL_SERVICE_NAME": "svc",
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"}))
    assert base.endpoint == "http://127.0.0.1:4318/v1/traces"
    assert dict(base.headers) == {"x-honeycomb-team": SECRET, "x-tenant": "a b"}
    assert (base.timeout_s, base.service_name, base.capture_content) == (3.0, "svc", True)
    assert base.source == "OTEL_EXPORTER_OTLP_ENDPOINT"

    specific = otlp_setting_from_env(Env({
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:6006/custom/traces",
        "OTEL_EXPORTER_OTLP_HEADERS": "a=1", "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "b=2"}))
    assert specific.endpoint == "http://127.0.0.1:6006/custom/traces"  # used as it is
    assert dict(specific.headers) == {"b": "2"}
    assert specific.capture_content is False


def test_header_values_are_never_shown():
    setting = otlp_setting("http://127.0.0.1:5000", [f"authorization=Bearer {SECRET}"])
    assert SECRET not in repr(setting)
    assert SECRET not in setting.destination()
    with pytest.raises(UsageError) as bad:
        otlp_setting("http://127.0.0.1:5000", [SECRET])  # a value pasted without its name
    assert SECRET not in bad.value.message and "NAME=VALUE" in bad.value.hint


def test_a_password_in_the_endpoint_is_never_kept_or_shown():
    # The destination is the key of what was sent there, kept in <db>.otlp-sent (issue 38).
    first = otlp_setting(f"http://user:{SECRET}@127.0.0.1:5000")
    second = otlp_setting("http://user:other-password@127.0.0.1:5000")
    assert SECRET not in first.destination() and SECRET not in repr(first)
    assert first.destination().startswith("http://****@127.0.0.1:5000/v1/traces (credentials")
    assert first.destination() != second.destination()  # other credentials, other tenant
    plain = otlp_setting("http://127.0.0.1:5000")
    assert plain.destination() == plain.endpoint  # what older state files hold: still resumed


@pytest.mark.parametrize("variables, named", [
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL=grpc"),
    ({"OTEL_EXPORTER_OTLP_TIMEOUT": "soon"}, "OTEL_EXPORTER_OTLP_TIMEOUT='soon'"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://user:{SECRET}@127.0.0.1:4318",
      "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20x"},
     "OTEL_EXPORTER_OTLP_ENDPOINT carries a user:password@ and the headers set Authorization"),
])
def test_a_value_that_cannot_work_stops_the_server_before_it_serves(variables, named):
    env = Env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", **variables})
    with pytest.raises(UsageError) as bad:
        LocalRunner(ServeSettings(app="math", env=env, keys=server_keys(env, "ephemeral"))
                    ).build()
    assert named in bad.value.message


@pytest.mark.parametrize("args, said", [
    (["--format", "otlp"], "--format otlp needs --endpoint URL"),
    (["--format", "otlp", "--endpoint", "127.0.0.1:5000"], "has no scheme"),
    (["--format", "otlp", "--endpoint", "http://127.0.0.1:5000", "--headers", SECRET],
     "cannot read the header"),
    (["--format", "otlp", "--endpoint", f"http://u:{SECRET}@127.0.0.1:5000", "--headers",
      "authorization=Basic%20eA"], "--endpoint carries a user:password@"),
    (["--format", "sft"], "--format sft needs --out FILE"),
    (["--format", "csv", "--out", "x"], "unknown --format 'csv'"),
])
def test_export_usage_errors_name_the_fix(tmp_path, args, said):
    done = run_cli(tmp_path, "traces", "export", *args, "--trace-db", str(tmp_path / "t.db"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert said in done.stderr and "hint:" in done.stderr
    assert SECRET not in done.stderr + done.stdout


def test_the_cli_never_loads_opentelemetry_to_start(tmp_path):
    for args in (["--help"], ["traces", "--help"], ["traces", "export", "--help"]):
        done = subprocess.run([sys.executable, "-X", "importtime", "-m", "synth_deploy.cli",
                               *args], cwd=tmp_path, env=clean_env(), capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
        loaded = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()]
        assert not [m for m in loaded if m.startswith(("opentelemetry", "mlflow"))], args
        assert "synth_deploy.otel" not in loaded


def test_the_standard_sampler_variables_choose_a_share_of_rollouts():
    on = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert otlp_setting_from_env(Env(on)).sample_ratio == 1.0
    ratio = otlp_setting_from_env(Env({**on, "OTEL_TRACES_SAMPLER": "traceidratio",
                                       "OTEL_TRACES_SAMPLER_ARG": "0.25"}))
    assert ratio.sample_ratio == 0.25
    assert otlp_setting_from_env(Env({**on, "OTEL_TRACES_SAMPLER": "always_off"})) is None
    for bad in ({"OTEL_TRACES_SAMPLER": "jaeger_remote"},
                {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}):
        with pytest.raises(UsageError, match="OTEL_TRACES_SAMPLER"):
            otlp_setting_from_env(Env({**on, **bad}))
