"""Rollouts in OpenTelemetry tools (MLflow, Phoenix, Langfuse, Jaeger, Tempo...): each
rollout as a trace of spans that follow the GenAI semantic conventions.

    setting = otlp_setting("http://127.0.0.1:5000", ["x-mlflow-experiment-id=1"])
    export_otlp(store, setting)                  # `traces export --format otlp`, resumable

    setting = otlp_setting_from_env(env)         # the standard OTEL_* variables, or None
    live = LiveExporter(setting)                 # a served app: `live.offer(session)` per
    ...                                          # finished rollout, sent in the background
    live.close()

The OpenTelemetry packages are the ``otel`` extra (``pip install 'synth-deploy[otel]'``);
they load only when spans are made, never at import or in the CLI's start-up.
"""

from synth_deploy._lazy import lazy_attributes
from synth_deploy.otel._setting import (
    CAPTURE_CONTENT_VAR,
    ENDPOINT_VAR,
    OtlpSetting,
    otlp_setting,
    otlp_setting_from_env,
    parse_headers,
)

# The exporters load on first use: every served app reads the OTEL_* settings, few send spans.
__getattr__ = lazy_attributes(__name__, {
    "OtlpExportError": "_export", "OtlpExportOptions": "_export",
    "OtlpExportResult": "_export", "default_state_path": "_export", "export_otlp": "_export",
    "LiveExporter": "_live", "LiveExportStats": "_live",
    "rollout_span_id": "_ids", "session_trace_id": "_ids"})

OTEL_EXTRA_HINT = ("install the OpenTelemetry packages: pip install 'synth-deploy[otel]' "
                   "(in a Modal image: ModalSettings(pip_packages=("
                   "\"opentelemetry-exporter-otlp-proto-http\",)))")


def otel_installed() -> bool:
    """True when the OTLP exporter can be imported (the ``otel`` extra is installed)."""
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        return False
    return True


def session_spans(session, *, service_name: str | None = None,
                  capture_content: bool = False) -> list:
    """One session's spans (root first), as `export_otlp` and `LiveExporter` send them."""
    from synth_deploy.otel._spans import SpanMaker

    return SpanMaker(service_name=service_name, capture_content=capture_content).spans(session)


def trace_id_of(session_id: str) -> int:
    """The trace id the spans of a session that came with no trace context carry (derived
    from the session id; `session_trace_id` says it for any session)."""
    from synth_deploy.otel._ids import trace_id_of as derive

    return derive(session_id)


__all__ = [
    "CAPTURE_CONTENT_VAR",
    "ENDPOINT_VAR",
    "OTEL_EXTRA_HINT",
    "LiveExportStats",
    "LiveExporter",
    "OtlpExportError",
    "OtlpExportOptions",
    "OtlpExportResult",
    "OtlpSetting",
    "default_state_path",
    "export_otlp",
    "otel_installed",
    "otlp_setting",
    "otlp_setting_from_env",
    "parse_headers",
    "rollout_span_id",
    "session_spans",
    "session_trace_id",
    "trace_id_of",
]
