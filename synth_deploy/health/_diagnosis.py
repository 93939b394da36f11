"""From symptom to fix: what an HTTP failure or an odd status code means for a task app.

Everything that knows the failure modes of what sits in front of an app lives here:
Cloudflare's 530 (tunnel down), gateways' 502/503/504, Modal's cold starts, synth-ai's
400-on-bad-key that leaks a key prefix, our own 401/403/503 auth answers.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from synth_deploy.health._http import RequestFailed

# synth-ai echoes key prefixes in these fields of a 400 (shared/spec/task-app-protocol.md).
# Where synth-ai's apps put part of the key: its auth's 400, its health routes without a key.
LEAK_FIELDS = frozenset({"allowed_first15", "got_first15", "expected_api_key_prefix"})
_LEAK_TEXT = re.compile(r'("(?:allowed_first15|got_first15|expected_api_key_prefix)"\s*:\s*)'
                        r'(\[[^\]]*\]|"[^"]*")')
EXCERPT_CHARS = 160


@dataclass(frozen=True)
class Diagnosis:
    code: str
    actual: str
    hint: str


def body_json(response: Any) -> Any:
    """The response body as JSON, or None when it is not JSON."""
    try:
        return json.loads(response.content)
    except (ValueError, UnicodeDecodeError):
        return None


def error_code(data: Any) -> str | None:
    """The ``code`` of a synth-ai style error body ``{"detail": {"error": {"code": ...}}}``."""
    if isinstance(data, dict):
        detail = data.get("detail")
        if isinstance(detail, dict):
            err = detail.get("error")
            if isinstance(err, dict) and isinstance(err.get("code"), str):
                return err["code"]
    return None


def error_message(data: Any) -> str | None:
    if isinstance(data, dict):
        detail = data.get("detail")
        if isinstance(detail, dict) and isinstance(detail.get("error"), dict):
            message = detail["error"].get("message")
            return message if isinstance(message, str) else None
        if isinstance(detail, str):
            return detail
    return None


def says_healthy(data: dict[str, Any]) -> bool:
    """A /health body that says the app is healthy: ours (``"healthy": true``), or synth-ai's
    health routes (``"status": "healthy"``), as synth-ai's own health checks read them."""
    if "healthy" in data:
        return data["healthy"] is True
    return str(data.get("status", "")).lower() in ("healthy", "ok")


def leaks_key_prefix(data: Any) -> bool:
    """True when a body carries a prefix of the valid key (synth-ai's ``allowed_first15``,
    ``expected_api_key_prefix``)."""
    if isinstance(data, dict):
        return bool(LEAK_FIELDS & data.keys()) or any(leaks_key_prefix(v)
                                                      for v in data.values())
    if isinstance(data, list):
        return any(leaks_key_prefix(v) for v in data)
    return False


def scrub(data: Any) -> Any:
    """A copy of a JSON body with every key-prefix field replaced by ``"<redacted>"``."""
    if isinstance(data, dict):
        return {k: ("<redacted>" if k in LEAK_FIELDS else scrub(v)) for k, v in data.items()}
    if isinstance(data, list):
        return [scrub(v) for v in data]
    return data


def excerpt(response: Any, limit: int = EXCERPT_CHARS) -> str:
    """A short, scrubbed view of a body for the ``actual`` column."""
    data = body_json(response)
    if data is not None:
        text = json.dumps(scrub(data), separators=(",", ":"), default=str)
    else:
        text = _LEAK_TEXT.sub(r'\1"<redacted>"', response.text if response.content else "")
        text = " ".join(text.split())
    if not text:
        return "(empty body)"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe(response: Any) -> str:
    """``"<status> <body excerpt>"``, plus the redirects that were followed."""
    text = f"{response.status_code} {excerpt(response)}"
    if response.history:
        hops = " → ".join(str(r.status_code) for r in response.history)
        text += f" (after {hops} redirect{'s' * (len(response.history) > 1)})"
    return text


def gateway_failure(response: Any) -> Diagnosis | None:
    """Statuses that mean the app itself was not reached or cannot serve anything now."""
    status = response.status_code
    data = body_json(response)
    shown = describe(response)
    if status == 530:
        cf = re.search(r"error code:?\s*(\d{4})", response.text or "")
        return Diagnosis(
            "cloudflare_530",
            f"530 from Cloudflare{f' (error {cf.group(1)})' if cf else ''}: origin unreachable",
            "Cloudflare cannot reach the origin: the cloudflared process or the local server "
            "behind it is down (or a new tunnel is still registering). Check that the local "
            "server answers, restart `synth-deploy tunnel`, or retry with --wait 30")
    if status == 503 and error_code(data) == "missing_environment_api_key":
        return Diagnosis(
            "server_key_missing", shown,
            "the server has no ENVIRONMENT_API_KEY configured, so it refuses every request: set "
            "it in the server's environment (a Modal Secret when deployed, `synth-deploy setup` "
            "locally) and restart the app")
    if status == 502:
        return Diagnosis(
            "bad_gateway", shown,
            "the proxy in front of the app (Cloudflare, Modal) got no valid answer from it: the "
            "app crashed or is still starting; read its logs (`modal app logs NAME` when "
            "deployed) or retry with --wait 60")
    if status == 503:
        return Diagnosis(
            "unavailable", shown,
            "the app is unavailable: a Modal cold start, an app still starting, or one that is "
            "overloaded; retry with --wait 60, and read its logs if it persists")
    if status == 524:
        return Diagnosis(
            "proxy_timeout", shown,
            "a proxy (Cloudflare: 100 s) cut a response that sent no byte for longer than it "
            "waits: the app must answer, or send its 200 head, sooner (apps this kit serves "
            "send the head after 20 s: lower it with serve --head-after S, "
            "SYNTH_DEPLOY_HEAD_AFTER_S or ModalSettings(head_after_s=))")
    if status == 504:
        return Diagnosis(
            "gateway_timeout", shown,
            "the gateway gave up waiting for the app: it is stuck or too slow to start; read "
            "its logs, and keep a container warm (min_containers) on Modal")
    if status == 429:
        return Diagnosis(
            "rate_limited", shown,
            "too many requests: a Cloudflare quick tunnel allows about 200 in flight; lower the "
            "trainer's rollout concurrency or use a named tunnel / Modal")
    return None


def auth_refusal(response: Any) -> str | None:
    """How the app refused a key: "missing" (401), "wrong" (403), "synth_ai" (400 +leak)."""
    status = response.status_code
    if status == 401:
        return "missing"
    if status == 403:
        return "wrong"
    if status == 400:
        data = body_json(response)
        if leaks_key_prefix(data) or error_code(data) in {"unauthorised", "unauthorized"}:
            return "synth_ai"
    return None


def transport_failure(exc: RequestFailed, *, answered_before: bool = False) -> Diagnosis:
    """A request that got no HTTP answer, as a diagnosis. ``answered_before``: the same URL
    answered earlier requests (so its host, port and scheme are right)."""
    kind, detail = exc.kind, exc.detail
    if kind == "protocol" and answered_before:
        return Diagnosis(
            "connection_cut", detail,
            "this URL answered the checks before, so host, port and scheme are right: the "
            "connection was cut before an answer came, by a proxy on the path whose time "
            "limit is shorter than this request (a corporate proxy, a load balancer) or by "
            "the app crashing; send the same request straight to the app to tell, and read "
            "its logs")
    if kind == "dns":
        return Diagnosis("dns_unresolved", detail,
                         "the host name does not resolve: check it for a typo, or retry with "
                         "--wait 30 if the tunnel or deployment is new")
    if kind == "refused":
        return Diagnosis("connection_refused", detail,
                         "nothing listens at this address: start the app or fix the port")
    if kind == "connect_timeout":
        return Diagnosis("connect_timeout", detail,
                         "the host did not answer: it is down, or a firewall drops the packets")
    if kind == "tls":
        return Diagnosis("tls_error", detail,
                         "the TLS handshake failed: check the certificate and http:// vs https://")
    if kind == "timeout":
        return Diagnosis(
            "timeout", detail,
            "the server accepted the connection but did not answer in time: the app is stuck "
            "(a blocked event loop?) or still starting; read its logs, or raise --timeout")
    if kind == "redirects":
        return Diagnosis("redirect_loop", detail,
                         "the URL redirects in a loop: check the base URL")
    if kind == "protocol":
        return Diagnosis(
            "protocol_error", detail,
            "the server closed the connection or does not speak HTTP: is it the right port, "
            "and http:// vs https:// right?")
    return Diagnosis("connect_error", detail,
                     "check the host and port, and that this machine can reach them")


__all__ = [
    "Diagnosis",
    "auth_refusal",
    "body_json",
    "describe",
    "error_code",
    "error_message",
    "excerpt",
    "gateway_failure",
    "leaks_key_prefix",
    "scrub",
    "transport_failure",
]
