"""`OtlpSetting`: where spans go (an OTLP/HTTP traces endpoint), resolved once at the entry.

Two ways in, one object out:

- ``traces export --format otlp --endpoint URL --headers K=V`` (`otlp_setting`);
- a served app: the standard variables, as the OpenTelemetry SDK reads them
  (`otlp_setting_from_env`), from the `Env` the command or container resolved:

    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT   the traces URL, used as it is
    OTEL_EXPORTER_OTLP_ENDPOINT          a base URL; /v1/traces is added
    OTEL_EXPORTER_OTLP_[TRACES_]HEADERS  k=v,k2=v2 (values URL-encoded)
    OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT  seconds per export, as the Python SDK reads it
    OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL only http/protobuf is spoken here
    OTEL_SERVICE_NAME                    the spans' service (default: the app id)
    OTEL_SDK_DISABLED=true, OTEL_TRACES_EXPORTER=none   turn it off
    OTEL_TRACES_SAMPLER=traceidratio, OTEL_TRACES_SAMPLER_ARG=0.1   send one rollout in ten
                                         (chosen by trace id: the same ones every time)
    OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true   message content on LM spans

Header values are secrets (API keys of hosted receivers): they are never shown, only masked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from synth_deploy.env import Env, mask, redact_userinfo
from synth_deploy.errors import UsageError
from synth_deploy.urls import http_url

ENDPOINT_VAR = "OTEL_EXPORTER_OTLP_ENDPOINT"
TRACES_ENDPOINT_VAR = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
HEADERS_VAR = "OTEL_EXPORTER_OTLP_HEADERS"
TRACES_HEADERS_VAR = "OTEL_EXPORTER_OTLP_TRACES_HEADERS"
TIMEOUT_VAR = "OTEL_EXPORTER_OTLP_TIMEOUT"
TRACES_TIMEOUT_VAR = "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"
PROTOCOL_VAR = "OTEL_EXPORTER_OTLP_PROTOCOL"
TRACES_PROTOCOL_VAR = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
SERVICE_NAME_VAR = "OTEL_SERVICE_NAME"
SDK_DISABLED_VAR = "OTEL_SDK_DISABLED"
TRACES_EXPORTER_VAR = "OTEL_TRACES_EXPORTER"
CAPTURE_CONTENT_VAR = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
SAMPLER_VAR = "OTEL_TRACES_SAMPLER"
SAMPLER_ARG_VAR = "OTEL_TRACES_SAMPLER_ARG"
_ALL = ("always_on", "parentbased_always_on")
_RATIO = ("traceidratio", "parentbased_traceidratio")
_NONE = ("always_off", "parentbased_always_off")

TRACES_PATH = "/v1/traces"
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_QUEUE_SESSIONS = 256


@dataclass(frozen=True)
class OtlpSetting:
    """An OTLP/HTTP (protobuf) traces endpoint and how to talk to it.

    ``endpoint`` is the full traces URL; ``headers`` go with every request (masked in the
    repr); ``capture_content`` puts the messages on LM spans (off by default: prompts may hold
    private data); ``queue_sessions`` bounds what a served app holds for a slow receiver;
    ``sample_ratio`` is the share of rollouts a served app sends (chosen by trace id).
    """

    endpoint: str
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S
    service_name: str | None = None
    capture_content: bool = False
    source: str = "--endpoint"
    queue_sessions: int = DEFAULT_QUEUE_SESSIONS
    sample_ratio: float = 1.0

    @property
    def display(self) -> str:
        """The endpoint with any userinfo masked: safe to print and log."""
        return redact_userinfo(self.endpoint)

    def destination(self) -> str:
        """Who receives the spans: the endpoint and the headers that choose a tenant or an
        experiment (values fingerprinted), the key of what was already sent there."""
        keys = ",".join(f"{k.lower()}={mask(v)}" for k, v in sorted(self.headers.items()))
        endpoint = self.display
        if endpoint != self.endpoint:  # its password, as headers are: told apart, not kept
            endpoint += f" (credentials {mask(self.endpoint)})"
        return f"{endpoint} [{keys}]" if keys else endpoint

    def __repr__(self) -> str:
        shown = {k: mask(v) for k, v in self.headers.items()}
        return (f"OtlpSetting(endpoint={self.display!r}, headers={shown!r}, "
                f"source={self.source!r})")


def traces_url(text: str, *, what: str) -> str:
    """A base URL gets ``/v1/traces``; a URL already ending in it is kept."""
    url = http_url(text, what=what)
    return url if url.endswith(TRACES_PATH) else url + TRACES_PATH


def parse_headers(items: list[str] | tuple[str, ...] | str, *, what: str) -> dict[str, str]:
    """``K=V`` items (or one ``k=v,k2=v2`` string, values URL-encoded, as OTel writes it)."""
    if isinstance(items, str):
        items = [part for part in items.split(",") if part.strip()]
    return dict(_header(item, what=what) for item in items)


def _header(item: str, *, what: str) -> tuple[str, str]:
    """One ``K=V`` item; the error shows the name only, as a value may be a credential."""
    name, sep, value = item.partition("=")
    name = unquote(name).strip()
    if not sep or not name or any(c.isspace() or c == ":" for c in name):
        shown = name if name and sep else "(a value not shown)"
        raise UsageError(f"{what}: cannot read the header {shown!r} (its value is not "
                         "shown)", hint="write each header as NAME=VALUE, e.g. "
                                        "x-mlflow-experiment-id=1")
    return name, unquote(value).strip()


def _one_credential(endpoint: str, headers: Mapping[str, str], *, what: str) -> None:
    """`UsageError` for a user:password@ in the endpoint beside an Authorization header: the
    exporter would send the endpoint's and drop the header without a word."""
    parts = urlsplit(endpoint)
    if (parts.username or parts.password) and any(k.lower() == "authorization"
                                                  for k in headers):
        raise UsageError(f"{what} carries a user:password@ and the headers set Authorization "
                         "too: both would be the one Authorization header, and one would be "
                         "dropped", hint="keep one: the endpoint without user:password@, or "
                                         "no Authorization header")


def otlp_setting(endpoint: str, headers: list[str] | tuple[str, ...] = (), *,
                 capture_content: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S,
                 service_name: str | None = None) -> OtlpSetting:
    """The setting the export command's flags give."""
    if timeout_s <= 0:
        raise UsageError(f"--timeout must be positive, got {timeout_s:g}")
    url = traces_url(endpoint, what="--endpoint")
    parsed = parse_headers(headers, what="--headers")
    _one_credential(url, parsed, what="--endpoint")
    return OtlpSetting(endpoint=url, headers=parsed, timeout_s=timeout_s,
                       service_name=service_name, capture_content=capture_content,
                       source="--endpoint")


def otlp_setting_from_env(env: Env) -> OtlpSetting | None:
    """The live setting the standard OTEL_* variables give; None when they name no endpoint
    or turn tracing off. A value that cannot work is a `UsageError` naming the variable."""
    if _turned_off(env):
        return None
    found = _endpoint(env)
    if found is None:
        return None
    endpoint, source = found
    _check_protocol(env)
    headers_var = _var(env, TRACES_HEADERS_VAR, HEADERS_VAR)
    headers = parse_headers(env.get(headers_var) or "", what=headers_var)
    _one_credential(endpoint, headers, what=source)
    timeout_s = _timeout(env)
    capture = (env.get(CAPTURE_CONTENT_VAR) or "").strip().lower() == "true"
    ratio = _sample_ratio(env)
    if ratio == 0.0:
        return None
    return OtlpSetting(endpoint=endpoint, headers=headers, timeout_s=timeout_s,
                       service_name=env.get(SERVICE_NAME_VAR), capture_content=capture,
                       source=source, sample_ratio=ratio)


def _turned_off(env: Env) -> bool:
    """The SDK's own off switches, honoured as any OTel SDK would."""
    if (env.get(SDK_DISABLED_VAR) or "").strip().lower() == "true":
        return True
    return (env.get(TRACES_EXPORTER_VAR) or "otlp").strip().lower() == "none"


def _var(env: Env, specific: str, general: str) -> str:
    """The traces-only variable when it is set, else the general one: OTel's precedence."""
    return specific if env.get(specific) else general


def _endpoint(env: Env) -> tuple[str, str] | None:
    """The traces URL and the variable it came from; the traces-only one is taken whole."""
    specific = env.get(TRACES_ENDPOINT_VAR)
    base = env.get(ENDPOINT_VAR)
    if not specific and not base:
        return None
    if specific:
        return http_url(specific, what=TRACES_ENDPOINT_VAR), TRACES_ENDPOINT_VAR
    return traces_url(base or "", what=ENDPOINT_VAR), ENDPOINT_VAR


def _check_protocol(env: Env) -> None:
    """`UsageError` for gRPC or JSON: the exporter speaks HTTP/protobuf only."""
    protocol_var = _var(env, TRACES_PROTOCOL_VAR, PROTOCOL_VAR)
    protocol = (env.get(protocol_var) or "http/protobuf").strip().lower()
    if protocol != "http/protobuf":
        raise UsageError(f"{protocol_var}={protocol}: synth-deploy sends spans over OTLP "
                         "HTTP/protobuf only", hint=f"set {protocol_var}=http/protobuf and "
                                                    "point the endpoint at the receiver's HTTP "
                                                    "port (4318 for a collector)")


def _timeout(env: Env) -> float:
    """The export timeout in seconds; a value that is not a positive number is refused."""
    timeout_var = _var(env, TRACES_TIMEOUT_VAR, TIMEOUT_VAR)
    raw = env.get(timeout_var)
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        timeout_s = float(raw)
    except ValueError:
        timeout_s = -1.0
    if not timeout_s > 0:
        raise UsageError(f"{timeout_var}={raw!r} is not a positive number of seconds",
                         hint=f"e.g. {timeout_var}=10")
    return timeout_s


def _sample_ratio(env: Env) -> float:
    """The share of rollouts to send, from the standard sampler variables."""
    sampler = (env.get(SAMPLER_VAR) or "parentbased_always_on").strip().lower()
    if sampler in _ALL:
        return 1.0
    if sampler in _NONE:
        return 0.0
    if sampler not in _RATIO:
        raise UsageError(f"{SAMPLER_VAR}={sampler}: not a sampler synth-deploy knows",
                         hint=f"use one of {', '.join(_ALL + _RATIO + _NONE)}")
    raw = env.get(SAMPLER_ARG_VAR) or "1.0"
    try:
        ratio = float(raw)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        raise UsageError(f"{SAMPLER_ARG_VAR}={raw!r} is not a ratio from 0 to 1",
                         hint=f"e.g. {SAMPLER_ARG_VAR}=0.1 sends one rollout in ten")
    return ratio


__all__ = [
    "CAPTURE_CONTENT_VAR",
    "ENDPOINT_VAR",
    "OtlpSetting",
    "otlp_setting",
    "otlp_setting_from_env",
    "parse_headers",
    "traces_url",
]
