"""The HTTP steps of a check: `/`, `/health`, auth enforcement, `/info`, `/task_info`, `/rollout`.

Each step records one `CheckResult`; a step after which later ones cannot mean anything
(no HTTP answer, a gateway failure, a refused key) raises `Stop` with the reason.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from synth_deploy.env import mask, missing_key_hint
from synth_deploy.health import _diagnosis as dx
from synth_deploy.health._http import HTTPClient, RequestFailed, Response
from synth_deploy.health._options import CheckOptions, RolloutOptions
from synth_deploy.health._report import CheckResult, HealthReport
from synth_deploy.health._schema import short_repr, validate
from synth_deploy.serving import answered_status, failure_kind
from synth_deploy.serving import containers as durable
from synth_deploy.taskapp.contracts import NO_REWARD, recorded_reward


class Stop(Exception):
    """Raised by a step after recording a result that makes later steps meaningless."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class EndpointSteps:
    """The protocol's endpoints probed through one `HTTPClient`; results go to ``report``."""

    def __init__(self, report: HealthReport, client: HTTPClient, options: CheckOptions, *,
                 api_key: str | None, key_source: str | None) -> None:
        self.report = report
        self.client = client
        self.base = report.url
        self.api_key = api_key
        self.key_label = f"{key_source or 'the key given'}, {mask(api_key)}"
        self.seeds = list(options.seeds)
        self.timeout_s = options.timeout_s
        self.slow_ms = options.slow_s * 1000
        # A random wrong key: a server that echoes it back is leaking what it is sent.
        self.wrong_key = "sk_env_wrong_" + secrets.token_hex(8)

    def add(self, result: CheckResult) -> CheckResult:
        self.report.checks.append(result)
        return result

    # --- HTTP helpers -----------------------------------------------------------------

    def request(self, method: str, path: str, *, key: str | None, timeout: float | None = None,
                **kwargs: Any) -> tuple[Any, float, dx.Diagnosis | None]:
        """(response, latency ms, None), or (None, latency ms, diagnosis) when no answer came."""
        headers = {"X-API-Key": key} if key else {}
        started = time.perf_counter()
        try:
            response = self.client.request(method, self.base + path, headers=headers,
                                           timeout=timeout or self.timeout_s, **kwargs)
        except RequestFailed as exc:
            answered = any(c.verdict == "pass" for c in self.report.checks)
            return None, (time.perf_counter() - started) * 1000, dx.transport_failure(
                exc, answered_before=answered)
        return response, (time.perf_counter() - started) * 1000, None

    def fail(self, name: str, expected: str, diagnosis: dx.Diagnosis, latency: float,
             stop: str | None = None) -> None:
        self.add(CheckResult(name, "fail", expected, diagnosis.actual, latency, diagnosis.hint,
                             diagnosis.code))
        if stop:
            raise Stop(stop)

    def passed(self, name: str, expected: str, actual: str, latency: float) -> None:
        if latency > self.slow_ms:
            self.add(CheckResult(
                name, "warn", expected, actual, latency, code="slow",
                hint=f"answered in {latency / 1000:.1f}s: a cold start (Modal), an overloaded "
                     f"app or a slow network; trainers time out on slow task apps, so keep a "
                     f"container warm (min_containers) or find what blocks the app"))
        else:
            self.add(CheckResult(name, "pass", expected, actual, latency))

    def unexpected(self, name: str, expected: str, response: Any, latency: float,
                   stop: str | None = None) -> None:
        """Any answer not handled by the step: gateway failures first, then 404, then others."""
        diagnosis = dx.gateway_failure(response)
        if diagnosis is not None:
            stop = stop or "the app is not reachable"
        elif response.status_code in (404, 405):
            diagnosis = dx.Diagnosis(
                "wrong_base_url", dx.describe(response),
                f"no such endpoint under {self.base}: this is not the task app's base URL "
                f"(a path prefix missing or extra?)")
        else:
            message = dx.error_message(dx.body_json(response))
            diagnosis = dx.Diagnosis(
                "unexpected_status", dx.describe(response),
                "the app answered with an error" + (f": {message}" if message else "")
                + "; read the app's logs")
        self.fail(name, expected, diagnosis, latency, stop)

    # --- steps ------------------------------------------------------------------------

    def root(self) -> None:
        expected = '200 {"status": "ok"} without a key'
        response, latency, failure = self.request("GET", "/", key=None)
        if failure is not None:
            self.fail("root", expected, failure, latency, "no HTTP answer")
        data = dx.body_json(response)
        if response.status_code == 200:
            if isinstance(data, dict) and data.get("status") == "ok":
                self.passed("root", expected, dx.describe(response), latency)
            else:
                self.add(CheckResult(
                    "root", "warn", expected, dx.describe(response), latency, code="unusual_root",
                    hint="a task app answers / with {\"status\": \"ok\"}: is this the app's "
                         "base URL?"))
            return
        if dx.gateway_failure(response) is not None or response.status_code >= 500:
            self.unexpected("root", expected, response, latency, stop="the app is not serving")
        hint = ("no / at this URL: is it the app's base URL? continuing with /health"
                if response.status_code in (404, 405) else
                "task apps answer / without a key; continuing with /health")
        self.add(CheckResult("root", "warn", expected, dx.describe(response), latency,
                             code="unusual_root", hint=hint))

    def health(self) -> bool:
        """/health with the key; True when the key is accepted (the later steps can run)."""
        expected = '200 {"healthy": true} (synth-ai: {"status": "healthy"}) with the key'
        if not self.api_key:
            response, latency, failure = self.request("GET", "/health", key=None)
            seen = failure.actual if failure else f"the app answered {response.status_code}"
            self.add(CheckResult(
                "health", "fail", expected, f"no key given ({seen})", latency, code="no_key",
                hint=missing_key_hint(flag="--api-key")))
            return False
        response, latency, failure = self.request("GET", "/health", key=self.api_key)
        if failure is not None:
            self.fail("health", expected, failure, latency, "no HTTP answer")
        refusal = dx.auth_refusal(response)
        if refusal == "missing":
            self.fail("health", expected, dx.Diagnosis(
                "key_not_received", dx.describe(response),
                "the app says no key was sent, but one was (X-API-Key): a proxy in between "
                "strips the header, or the app reads another one"), latency)
            return False
        if refusal is not None:
            synth_ai = (" (a synth-ai app: it answers a bad key with 400)"
                        if refusal == "synth_ai" else "")
            self.fail("health", expected, dx.Diagnosis(
                "key_mismatch", f"{response.status_code}: the key was refused{synth_ai}",
                f"the key sent ({self.key_label}) is not one the app accepts: give the server "
                f"and this check the same ENVIRONMENT_API_KEY (the Modal Secret when deployed, "
                f"the server's .env locally) and restart the server; the sha256 fingerprint "
                f"tells keys apart without showing them"), latency)
            return False
        if response.status_code != 200:
            self.unexpected("health", expected, response, latency, stop="/health fails")
        data = dx.body_json(response)
        if not isinstance(data, dict):
            self.fail("health", expected, dx.Diagnosis(
                "not_json", dx.describe(response),
                "/health did not answer JSON: this URL is not a task app (check the base URL)"),
                latency, "the URL does not serve a task app")
        if data.get("authorized") is False:  # synth-ai's health: answered, key not taken
            self.fail("health", expected, dx.Diagnosis(
                "key_mismatch", f"{dx.describe(response)}: the key was not authorized",
                f"the key sent ({self.key_label}) is not one the app accepts: give the server "
                f"and this check the same ENVIRONMENT_API_KEY and restart the server"), latency)
            return False
        self._read_traces(data)
        if isinstance(data.get("identity"), dict):
            identity = data["identity"]
            self.report.identity = {k: identity.get(k) for k in ("version", "digest", "label")}
        if not dx.says_healthy(data):
            self.fail("health", expected, dx.Diagnosis(
                "reports_unhealthy", dx.describe(response),
                "the app says it is not healthy: read its logs (a failed startup hook or "
                "dataset?)"), latency)
            return True
        self.passed("health", expected, dx.describe(response), latency)
        return True

    def _read_traces(self, health: Any) -> None:
        if isinstance(health, dict) and isinstance(health.get("tracing"), dict):
            tracing = health["tracing"]
            self.report.traces = {"enabled": bool(tracing.get("enabled")),
                                  "destination": tracing.get("destination"),
                                  "durable": tracing.get("durable"),
                                  "sessions": tracing.get("sessions")}

    def recount_traces(self) -> None:
        """The traces /health describes, read again: the sessions stored so far include the
        check's own rollout (the count read before it would be one short)."""
        if self.report.traces is None:
            return
        response, _, failure = self.request("GET", "/health", key=self.api_key)
        if failure is None and response.status_code == 200:
            self._read_traces(dx.body_json(response))

    def auth(self) -> None:
        """Rollouts without a key and with a wrong key must be refused. ``/health`` is asked
        too; answering it without a key is no fault: synth-ai's apps do, by design."""
        expected = "no key → 401, wrong key → 403 (refused)"
        probes = [("no key", "GET", "/health", None, {}),
                  ("wrong key", "GET", "/health", self.wrong_key, {}),
                  ("/rollout without key", "POST", "/rollout", None, {"json": {}}),
                  ("/rollout with a wrong key", "POST", "/rollout", self.wrong_key,
                   {"json": {}})]
        seen, open_, odd, leak, latency = [], [], [], False, 0.0
        for label, method, path, key, extra in probes:
            response, ms, failure = self.request(method, path, key=key, **extra)
            latency = max(latency, ms)
            if failure is not None:
                seen.append(f"{label} → {failure.actual}")
                odd.append(label)
                continue
            status = response.status_code
            seen.append(f"{label} → {status}")
            data = dx.body_json(response)
            leak |= dx.leaks_key_prefix(data) or self.wrong_key[:15] in response.text
            # A 422 means the body was validated, which auth dependencies run before: the
            # request got past auth.
            if path == "/health" and 200 <= status < 300:
                continue
            if 200 <= status < 300 or (status == 422 and method == "POST"):
                open_.append(label)
            elif dx.auth_refusal(response) is None and dx.error_code(data) != \
                    "missing_environment_api_key":
                odd.append(label)
        actual = ", ".join(seen)
        if open_:
            self.add(CheckResult(
                "auth", "fail", expected, actual, latency, code="open_to_anyone",
                hint="the app is open to anyone: it answered a request without a valid key "
                     f"({', '.join(open_)}), so anyone with the URL can run rollouts on your "
                     "inference budget. Require ENVIRONMENT_API_KEY (create_app does) and set "
                     "it on the server"))
        elif leak:
            self.add(CheckResult(
                "auth", "warn", expected, actual + " (key material in the refusal body)",
                latency, code="key_leak",
                hint="the app refuses bad keys but echoes key material in its error body "
                     "(synth-ai's allowed_first15: the first 15 characters of the valid key): "
                     "anyone can read part of the key. Serve it with synth-deploy (401/403, no "
                     "key material) and rotate the key"))
        elif odd:
            self.add(CheckResult(
                "auth", "warn", expected, actual, latency, code="auth_unverified",
                hint=f"could not confirm that {', '.join(odd)} is refused: the app answered "
                     "neither 2xx nor 401/403"))
        else:
            self.add(CheckResult("auth", "pass", expected, actual, latency))

    def info(self) -> None:
        expected = "200 with service.task {id, name}"
        response, latency, failure = self.request("GET", "/info", key=self.api_key)
        if failure is not None:
            self.fail("info", expected, failure, latency)
            return
        if response.status_code != 200:
            self.unexpected("info", expected, response, latency)
            return
        data = dx.body_json(response)
        service = data.get("service") if isinstance(data, dict) else None
        if not isinstance(service, dict):
            self.schema_failure("info", "/info", "service", "an object with task {id, name}",
                                short_repr(service) if isinstance(data, dict) else
                                dx.excerpt(response), latency)
            return
        task, problem = validate("TaskDescriptor", service.get("task"))
        if problem is not None:
            path = "service.task" + ("." + problem["path"] if problem["path"] != "(document)"
                                     else "")
            self.schema_failure("info", "/info", path, problem["expected"],
                                problem["actual"] + problem["more"], latency)
            return
        version = service.get("version")
        self.passed("info", expected, f"task {task.id!r} ({task.name})"
                    + (f", version {version}" if version else ""), latency)

    def task_info(self) -> None:
        expected = '200 {"taskset": ...}'
        response, latency, failure = self.request("GET", "/task_info", key=self.api_key)
        if failure is not None:
            self.fail("task_info", expected, failure, latency)
            return
        if response.status_code != 200:
            self.unexpected("task_info", expected, response, latency)
            return
        data = dx.body_json(response)
        if not isinstance(data, dict) or "taskset" not in data:
            self.schema_failure("task_info", "/task_info", "taskset", "present", "missing"
                                if isinstance(data, dict) else dx.excerpt(response), latency)
            return
        taskset = data["taskset"]
        label = (taskset.get("id") or taskset.get("name")) if isinstance(taskset, dict) else None
        self.passed("task_info", expected, f"taskset {label!r}" if label else "taskset present",
                    latency)

    def task_info_seeds(self) -> None:
        shown = _seed_text(self.seeds)
        expected = f"a valid TaskInfo for seed {shown}"
        params = [("seed", str(s)) for s in self.seeds]
        response, latency, failure = self.request("GET", "/task_info", key=self.api_key,
                                                  params=params)
        name = "task_info_seeds"
        if failure is not None:
            self.fail(name, expected, failure, latency)
            return
        if response.status_code != 200:
            if response.status_code in (404, 422) and dx.error_code(dx.body_json(response)):
                message = dx.error_message(dx.body_json(response)) or ""
                self.fail(name, expected, dx.Diagnosis(
                    "bad_seed", dx.describe(response),
                    f"the app has no task instance for seed {shown}: {message} — pass --seeds "
                    f"from the app's dataset"), latency)
                return
            self.unexpected(name, expected, response, latency)
            return
        data = dx.body_json(response)
        items = data if isinstance(data, list) else [data]
        if len(items) != len(self.seeds):
            self.schema_failure(name, "/task_info", "(document)",
                                f"{len(self.seeds)} TaskInfo object(s)",
                                f"{len(items)}", latency)
            return
        ids = set()
        for seed, item in zip(self.seeds, items, strict=True):
            info, problem = validate("TaskInfo", item)
            if problem is not None:
                self.schema_failure(name, f"/task_info?seed={seed}", problem["path"],
                                    problem["expected"], problem["actual"] + problem["more"],
                                    latency)
                return
            ids.add(info.task.id)
        self.passed(name, expected, f"{len(items)} valid TaskInfo (task {', '.join(sorted(ids))})",
                    latency)

    def rollout(self, options: RolloutOptions) -> None:
        seed = self.seeds[0]
        expected = f"200 RolloutResponse for an eval rollout of seed {seed}"
        run_id = "synth-deploy-check-" + secrets.token_hex(4)
        timeout_s = max(options.timeout_s, self.timeout_s)
        policy_config: dict[str, Any] = {"inference_url": options.inference_url}
        if options.model:
            policy_config["model"] = options.model
        body = {"run_id": run_id, "mode": "eval", "env": {"seed": seed, "config": {}},
                "policy": {"policy_name": "synth-deploy-check", "config": policy_config},
                # Its trace says whether the app's sandboxes started, and how fast.
                "record": {"return_trace": True}, "safety": {"max_time_s": timeout_s}}
        path, why = self.rollout_path()
        waits = durable.AdmissionWaits()
        if path == "async":
            response, latency, failure = self.async_rollout(body, timeout_s, waits)
        else:
            response, latency, failure = self.admitted(waits, "POST", "/rollout",
                                                       key=self.api_key, json=body,
                                                       timeout=timeout_s)
        if waits.refusals:  # the app was full: said, and not counted as the rollout's time
            why += (f"; waited {waits.waited_s:.1f}s for a slot ({waits.refusals} x 503 "
                    "Retry-After: the app was full)")
        if failure is not None:
            self.fail("rollout", expected, failure, latency)
            return
        data = dx.body_json(response)
        status = answered_status(response.status_code, data)  # a late failure is in the body
        if status != 200:
            code, message = dx.error_code(data), dx.error_message(data) or dx.excerpt(response)
            kind, retryable = failure_kind(status, data)
            if kind is not None:  # who failed, as the app classified it
                message = f"{message} [{kind}{', retryable' if retryable else ''}]"
            if status == 422 and code in (None, "invalid_request"):
                self.fail("rollout", expected, dx.Diagnosis(
                    "rollout_rejected", f"422 {message}",
                    "the app rejected a protocol RolloutRequest: its request model is stricter "
                    "than the protocol (shared/spec/task-app-protocol.md)"), latency)
            elif status in (404, 422) and code:
                self.fail("rollout", expected, dx.Diagnosis(
                    code, f"{status} {message}",
                    "the app refused the check's rollout (a BadRequest): read the message; "
                    "a seed its datasets lack is fixed with --seeds"), latency)
            elif code == "policy_failed":
                self.fail("rollout", expected, dx.Diagnosis(
                    code, f"{status} {message}",
                    "the app could not get an answer from the policy: check that the app can "
                    "reach the inference URL and that the model exists"), latency)
            elif code == "rollout_failed" and "SandboxError" in message:
                self.fail("rollout", expected, dx.Diagnosis(
                    "sandbox_failed", f"{status} {message}",
                    "the app's sandbox could not start or run: read the message (on Modal: the "
                    "image and the workspace's sandbox quota; locally: the sandbox folder)"),
                    latency)
            elif code in ("rollout_failed", "rollout_timeout", "invalid_rollout_result",
                          "trace_write_failed"):
                self.fail("rollout", expected, dx.Diagnosis(
                    code, f"{status} {message}",
                    "the rollout failed inside the app: read the message and the app's logs; "
                    "check that the app can reach the inference URL and that the model exists"),
                    latency)
            else:
                self.unexpected("rollout", expected, response, latency)
            return
        result, problem = validate("RolloutResponse", data)
        if problem is not None:
            self.schema_failure("rollout", "/rollout", problem["path"], problem["expected"],
                                problem["actual"] + problem["more"], latency)
            return
        actual = (f"reward_mean={result.metrics.reward_mean:g}, steps={result.metrics.num_steps}"
                  f", {latency / 1000:.2f}s, {path}: {why}")
        if result.run_id != run_id:
            self.add(CheckResult("rollout", "warn", expected, actual + f", run_id "
                                 f"{result.run_id!r}", latency, code="run_id_mismatch",
                                 hint="the app must echo the request's run_id: trainers match "
                                      "responses to requests by it"))
            return
        if recorded_reward(data.get("metrics") or {}) is None:
            self.add(CheckResult("rollout", "warn", expected, actual + ", no reward recorded",
                                 latency, code="no_reward", hint=NO_REWARD))
            return
        self.add(CheckResult("rollout", "pass", expected, actual, latency))
        self.sandboxes(data.get("trace"))

    def sandboxes(self, trace: Any) -> None:
        """A line on the sandboxes the check's rollout started, when it started any."""
        from synth_deploy.sandbox import summarize_traces

        summary = summarize_traces([trace])
        if summary.used:
            self.add(CheckResult("sandboxes", "warn" if summary.hint else "pass",
                                 "the rollout's sandboxes start and run, isolated as set",
                                 summary.describe(), max(summary.start_ms), hint=summary.hint,
                                 code="sandbox_network_open" if summary.hint else "ok"))

    def rollout_path(self) -> tuple[str, str]:
        """("async" or "sync", why): async when the app advertises it."""
        response, _, failure = self.request("GET", durable.METADATA_PATH, key=self.api_key)
        if failure is None and response.status_code == 200 and \
                durable.advertises_async(dx.body_json(response)):
            return "async", "submitted and polled (the app advertises async rollouts)"
        answered = "no answer" if failure is not None else response.status_code
        return "sync", f"POST /rollout (no async rollouts advertised: {answered})"

    def admitted(self, waits: durable.AdmissionWaits, method: str, path: str, **kwargs: Any
                 ) -> tuple[Any, float, dx.Diagnosis | None]:
        """`request`, sent again while a full app refuses it for a slot (503 with
        Retry-After; ``waits`` says how long)."""
        answer = self.request(method, path, **kwargs)
        while answer[2] is None and (pause := waits.after(
                answer[0].status_code, answer[0].headers)) is not None:
            time.sleep(pause)
            answer = self.request(method, path, **kwargs)
        return answer

    def async_rollout(self, body: dict[str, Any], timeout_s: float,
                      waits: durable.AdmissionWaits | None = None
                      ) -> tuple[Any, float, dx.Diagnosis | None]:
        """Submit ``body`` asynchronously and long-poll it (backing off after a failed
        poll): (a response as POST
        /rollout would have answered, latency ms, None), or a diagnosis of no answer."""
        started = time.perf_counter()
        response, _, failure = self.admitted(waits or durable.AdmissionWaits(), "POST",
                                             durable.SUBMIT_PATH, key=self.api_key,
                                             json=durable.async_submission(body))
        document = None if failure is not None else dx.body_json(response)
        if failure is not None or response.status_code not in (200, 202) \
                or not isinstance(document, dict):
            return response, (time.perf_counter() - started) * 1000, failure
        delay, failures = durable.FIRST_POLL_S, 0
        give_up = time.monotonic() + timeout_s + 60.0
        while document.get("status") == "running" and time.monotonic() < give_up:
            polled, _, failure = self.request("GET", durable.poll_path(body["run_id"]),
                                              key=self.api_key)  # a long poll
            if failure is not None or durable.retryable(polled.status_code):
                time.sleep(delay)
                delay = durable.next_poll_delay(delay)
                failures += 1
                if failures > durable.POLL_FAILURES_ALLOWED:
                    return polled, (time.perf_counter() - started) * 1000, failure
                continue
            failures = 0
            document = dx.body_json(polled)
            if polled.status_code != 200 or not isinstance(document, dict):
                return polled, (time.perf_counter() - started) * 1000, None
        if document.get("status") == "running":
            status, answer = 504, {"detail": {"error": {
                "code": "rollout_timeout", "message": "still running after the check's "
                f"{timeout_s + 60:g}s"}}}
        else:
            status, answer = durable.rollout_answer(document)
        latency = (time.perf_counter() - started) * 1000
        return Response(status, json.dumps(answer).encode(), response.url), latency, None

    def schema_failure(self, name: str, where: str, path: str, expected: str, actual: str,
                       latency: float) -> None:
        self.add(CheckResult(
            name, "fail", f"{path}: {expected}", f"{path}: {actual}", latency,
            code="schema_mismatch",
            hint=f"{where} breaks the protocol at {path} (expected {expected}); fix the app's "
                 f"answer (see shared/spec/task-app-protocol.md)"))


def _seed_text(seeds: list[int]) -> str:
    if len(seeds) > 1 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    text = ",".join(str(s) for s in seeds[:8])
    return text + ("…" if len(seeds) > 8 else "")


__all__ = ["EndpointSteps", "Stop"]
