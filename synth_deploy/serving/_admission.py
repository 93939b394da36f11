"""What a served app admits: how many rollouts run at once, how a long one outlives proxy
cutoffs, and what a client may hold of its connections (`ConnectionLimits`, enforced by
`_connections`).

`RolloutLimits` is resolved once where the app is served (`rollout_limits`: a flag, else
``SYNTH_DEPLOY_MAX_ROLLOUTS``, else the default) and given to `create_app`:

- **admission**: at most ``max_in_flight`` rollouts run at once; the next is answered 503 with
  ``Retry-After`` before its body is read. ``/health`` says the capacity and what is in flight.
  Connections are not the limit (a trainer may open many and send few); rollouts are.
- **an early head**: proxies between a trainer and the app cut a request whose response is
  silent too long (Cloudflare answers 524 after 125 s without a byte; Modal turns a request
  not answered in 150 s into a 303 to a result URL: `synth_deploy.proxy_limits`). Under the
  strict reading of Modal's docs a buffered body is redirected all the same: a client that
  must not depend on a proxy's patience submits asynchronously (`serving.containers`).
  A rollout still running after ``head_after_s`` gets its ``200`` head and a space, then a
  space every ``heartbeat_s``, then its JSON body: leading whitespace is valid JSON, so any
  client reads it as before. The price: once the head has left, a rollout that then fails
  cannot change the status; its body is the usual error document, with the status it stands
  for in ``detail.error.status`` (`answered_status` reads it back).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any

from synth_deploy.env import Env
from synth_deploy.errors import UsageError

MAX_ROLLOUTS_VAR = "SYNTH_DEPLOY_MAX_ROLLOUTS"
HEAD_AFTER_VAR = "SYNTH_DEPLOY_HEAD_AFTER_S"
HEARTBEAT_VAR = "SYNTH_DEPLOY_HEARTBEAT_S"
DRAIN_VAR = "SYNTH_DEPLOY_DRAIN_S"  # how long SIGTERM waits for rollouts in flight
DEFAULT_MAX_ROLLOUTS = 10_000
# Well inside the shortest silence a common proxy allows (nginx's 60 s, Cloudflare's 125 s,
# Modal's 150 s), late enough that most rollouts are answered with their own status.
DEFAULT_HEAD_AFTER_S = 20.0
DEFAULT_HEARTBEAT_S = 15.0
_DURATIONS_KEPT = 100_000


@dataclass(frozen=True)
class RolloutLimits:
    """``max_in_flight``: rollouts run at once (beyond: 503 + Retry-After); ``head_after_s``:
    when a running rollout's 200 head is sent; ``heartbeat_s``: a space that often after."""

    max_in_flight: int = DEFAULT_MAX_ROLLOUTS
    head_after_s: float = DEFAULT_HEAD_AFTER_S
    heartbeat_s: float = DEFAULT_HEARTBEAT_S

    def __post_init__(self) -> None:
        if isinstance(self.max_in_flight, bool) or not isinstance(self.max_in_flight, int) \
                or self.max_in_flight < 1:
            raise UsageError(f"max rollouts in flight must be a whole number >= 1, got "
                             f"{self.max_in_flight!r}")
        for name in ("head_after_s", "heartbeat_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise UsageError(f"{name} must be a number of seconds > 0, got {value!r}")


def rollout_limits(env: Env, max_in_flight: int | None = None, *,
                   head_after_s: float | None = None,
                   heartbeat_s: float | None = None) -> RolloutLimits:
    """The limits a served app runs with, each a flag when given, else its variable from
    ``env`` (``SYNTH_DEPLOY_MAX_ROLLOUTS``, ``SYNTH_DEPLOY_HEAD_AFTER_S``,
    ``SYNTH_DEPLOY_HEARTBEAT_S``), else the default. A proxy with a limit shorter than
    Cloudflare's 125 s needs an earlier head (and heartbeat) than the defaults."""
    if max_in_flight is None:
        max_in_flight = setting_from_env(env, MAX_ROLLOUTS_VAR, int, "a whole number",
                                         f"the most rollouts the app may run at once, e.g. "
                                         f"{DEFAULT_MAX_ROLLOUTS}")
    if head_after_s is None:
        head_after_s = setting_from_env(env, HEAD_AFTER_VAR, float, "a number of seconds",
                                        "seconds before a running rollout's 200 head is "
                                        "sent, below the shortest proxy limit on the path, "
                                        "e.g. 20")
    if heartbeat_s is None:
        heartbeat_s = setting_from_env(env, HEARTBEAT_VAR, float, "a number of seconds",
                                       "seconds between the spaces a long rollout sends, "
                                       "e.g. 15")
    return RolloutLimits(
        max_in_flight=DEFAULT_MAX_ROLLOUTS if max_in_flight is None else max_in_flight,
        head_after_s=DEFAULT_HEAD_AFTER_S if head_after_s is None else head_after_s,
        heartbeat_s=DEFAULT_HEARTBEAT_S if heartbeat_s is None else heartbeat_s)


def setting_from_env(env: Env, name: str, kind: Any, what: str, fix: str) -> Any:
    """The variable ``name`` of ``env`` read as ``kind`` (None when unset or blank); a
    value that is not ``what`` is a `UsageError` naming where it came from and ``fix``."""
    raw = env.get(name)
    if raw is None or not raw.strip():
        return None
    try:
        return kind(raw.strip())
    except ValueError:
        raise UsageError(f"{name}={raw!r} ({env.source(name)}) is not {what}",
                         hint=f"set {name} to {fix}") from None


class RolloutStats:
    """A served app's rollout counters, read by status lines (`snapshot`) and ``/health``."""

    __slots__ = ("capacity", "rollout_requests", "rollouts", "errors", "refused", "in_flight",
                 "traced", "durations", "_said")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.rollout_requests = 0  # POST /rollout with the key, refused ones included
        self.rollouts = 0  # answered 200
        self.errors = 0  # answered other than 200: failed, refused by the app, not stored
        self.refused = 0  # answered 503: at capacity
        self.in_flight = 0
        self.traced = 0  # sessions stored by this process
        self.durations: list[float] = []  # seconds, since the last `take_durations`
        self._said = (0, 0)  # errors and refusals at the last summary

    def admit(self) -> bool:
        """Take a slot for a rollout about to run (True), or count it refused: the app is
        running ``capacity`` rollouts already (False: answer it `at_capacity`)."""
        if self.in_flight >= self.capacity:
            self.refused += 1
            return False
        self.in_flight += 1
        return True

    def release(self) -> None:
        """Give back a slot `admit` took: its rollout has its answer."""
        self.in_flight -= 1

    def snapshot(self) -> dict[str, int]:
        return {"rollout_requests": self.rollout_requests, "rollouts": self.rollouts,
                "errors": self.errors, "refused": self.refused, "in_flight": self.in_flight,
                "capacity": self.capacity}

    def record(self, duration_s: float) -> None:
        """A finished rollout's duration, for the next summary (a bounded sample: nobody
        may ever ask for one)."""
        if len(self.durations) < _DURATIONS_KEPT:
            self.durations.append(duration_s)

    def take_durations(self) -> list[float]:
        """The durations recorded since the last call (safe from another thread)."""
        taken, self.durations = self.durations, []
        return taken

    def summary(self, interval_s: float) -> str | None:
        """One line on the rollouts answered since the last summary (None: nothing
        happened): how many and how fast, their p50/p99, errors, refusals, in flight."""
        durations = sorted(self.take_durations())
        errors, refused = self.errors, self.refused
        new_errors, new_refused = errors - self._said[0], refused - self._said[1]
        self._said = (errors, refused)
        if not durations and not self.in_flight and not new_refused:
            return None
        parts = [f"{len(durations)} rollout{'' if len(durations) == 1 else 's'} in "
                 f"{interval_s:.3g}s ({len(durations) / max(interval_s, 1e-3):.1f}/s)"]
        if durations:
            p50 = durations[len(durations) // 2]
            p99 = durations[min(len(durations) - 1, int(len(durations) * 0.99))]
            parts.append(f"p50 {p50:.2f}s p99 {p99:.2f}s")
        parts.append(f"{new_errors} error{'' if new_errors == 1 else 's'}")
        if new_refused:
            parts.append(f"{new_refused} refused (at capacity)")
        parts.append(f"{self.in_flight}/{self.capacity} in flight")
        return " · ".join(parts)


def at_capacity(capacity: int) -> tuple[int, str, str, dict[str, str]]:
    """The refusal of a rollout `RolloutStats.admit` did not admit: status, code, message and
    headers (a client retries after ``Retry-After``; the app is not failing)."""
    return (503, "at_capacity", f"the app is running its maximum of {capacity} rollouts at "
            "once; retry shortly", {"retry-after": "1"})


def answered_status(status_code: int, body: Any) -> int:
    """The status a rollout's answer stands for: a 200 whose body is an error document (sent
    after the early head) stands for the status the error names."""
    if status_code == 200 and isinstance(body, dict) and isinstance(body.get("detail"), dict):
        error = body["detail"].get("error")
        if isinstance(error, dict) and isinstance(error.get("status"), int):
            return error["status"]
    return status_code


def failure_kind(status: int, data: Any) -> tuple[str | None, bool | None]:
    """Who failed a rollout answered ``status`` with ``data``, and whether a retry may help:
    as the app classified it (``detail.error.kind``/``retryable``, or a synth-containers
    document's ``error``); else from the status alone, for apps that do not say (a proxy's
    5xx and a 429 are the network's and retryable, a 4xx the client's; other answers are
    left unclassified)."""
    error: Any = None
    if isinstance(data, dict):
        detail = data.get("detail")
        error = detail.get("error") if isinstance(detail, dict) else data.get("error")
    if isinstance(error, dict) and isinstance(error.get("kind"), str):
        return error["kind"], bool(error.get("retryable"))
    if status in _NETWORK_STATUS:
        return "network", True
    if 400 <= status < 500:
        return "client", False
    return None, None


# A proxy's answer on the way to the app (Cloudflare's 52x, a gateway's 502/504), a 429, or a
# full app's 503: the network's, and worth sending again.
_NETWORK_STATUS = frozenset((429, 502, 503, 504, 520, 521, 522, 523, 524))


class InFlight:
    """One rollout in flight, as `EarlyHeads` keeps it: its early head and heartbeat (sent by
    a task of its own once due), and whether its client is still there. Once the rollout has
    run a sweep's interval, a task waits for the client's disconnect: a client that leaves
    asks ``stop`` (the rollout's `RolloutStop`) to stop it, and ``left`` says so."""

    __slots__ = ("started", "send", "receive", "stop", "task", "listener", "head_sent", "left")

    def __init__(self, started: float, send: Any, receive: Any, stop: Any) -> None:
        self.started = started
        self.send, self.receive = send, receive
        self.stop = stop
        self.task: asyncio.Task[None] | None = None
        self.listener: asyncio.Task[None] | None = None
        self.head_sent = False
        self.left = False

    async def listen(self) -> None:
        while (await self.receive())["type"] != "http.disconnect":
            pass  # the body was read: nothing else comes before the disconnect
        self.left = True
        if self.stop is not None:
            self.stop.request("client_disconnected")


def _client_gone(receive: Any) -> bool:
    """Whether a request's client has left, asked without waiting: a disconnect the server
    has seen is there at once, anything else would wait (as `Request.is_disconnected`).

    ``receive()`` is run up to its first wait and dropped there: what a cancel scope does,
    without a cancellation's cost (which formats the task) on every rollout's answer."""
    asking = receive().__await__()
    try:
        asking.send(None)
    except StopIteration as answered:
        return answered.value["type"] == "http.disconnect"
    asking.close()  # it waits: the client is there (its waiter is taken back as it closes)
    return False


_HEAD = {"type": "http.response.start", "status": 200,
         "headers": [(b"content-type", b"application/json")]}
_SPACE = {"type": "http.response.body", "body": b" ", "more_body": True}


class EarlyHeads:
    """Sends the head and a heartbeat for rollouts that run past ``head_after_s``, and
    stops those whose client left (`InFlight`).

    A rollout is registered when it starts (`watch`) and released when it has its answer
    (`answer`). One sweep per app, while rollouts run, starts a pulse task for each that is
    due, and a listener for each that has run an interval: short rollouts cost a dict entry,
    never a task or a timer.
    """

    def __init__(self, limits: RolloutLimits) -> None:
        self.head_after_s = limits.head_after_s
        self.heartbeat_s = limits.heartbeat_s
        self.interval = min(limits.head_after_s, limits.heartbeat_s) / 4
        self._running: dict[int, InFlight] = {}
        self._sweeping: asyncio.AbstractEventLoop | None = None  # the loop a sweep runs on

    def watch(self, send: Any, receive: Any, stop: Any = None) -> InFlight:
        """Register a rollout starting now; ``stop``: what stops it if its client leaves
        (an object with ``request(reason)``), None when nothing need be stopped."""
        loop = asyncio.get_running_loop()
        pulse = InFlight(loop.time(), send, receive, stop)
        self._running[id(pulse)] = pulse
        if self._sweeping is not loop:
            self._sweeping = loop
            loop.call_later(self.interval, self._sweep, loop)
        return pulse

    async def answer(self, pulse: InFlight, response: Any, scope: Any, receive: Any,
                     late_body: bytes | None = None) -> bool:
        """Send ``response`` (a Starlette response with its body) for ``pulse``'s rollout;
        False when its client had left before the last byte was handed to the server.
        ``late_body``: what to send instead of the body once the 200 head has gone, for a
        response of another status (its error document saying that status)."""
        del self._running[id(pulse)]
        if pulse.listener is None and _client_gone(receive):
            pulse.left = True  # a short rollout, no listener: its client left meanwhile
        try:
            await self._send(pulse, response, scope, receive, late_body)
            # Read before the listener runs again: once the response is complete, the
            # server answers its receive with a disconnect whatever the client did.
            return not pulse.left
        finally:
            if pulse.listener is not None:
                pulse.listener.cancel()

    async def _send(self, pulse: InFlight, response: Any, scope: Any, receive: Any,
                    late_body: bytes | None) -> None:
        if pulse.task is not None:
            pulse.task.cancel()
            try:
                await pulse.task
            except asyncio.CancelledError:
                pass
        if not pulse.head_sent:
            await response(scope, receive, pulse.send)
            return
        body = response.body if response.status_code == 200 or late_body is None else late_body
        await pulse.send({"type": "http.response.body", "body": body, "more_body": False})

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._sweeping is not loop:
            return  # replaced: the app is served on another loop now
        if not self._running:
            self._sweeping = None  # the next rollout starts a new sweep
            return
        now = loop.time()
        for pulse in list(self._running.values()):
            if pulse.listener is None and pulse.started <= now - self.interval:
                pulse.listener = loop.create_task(pulse.listen())
            if pulse.task is None and pulse.started <= now - self.head_after_s:
                pulse.task = loop.create_task(self._beat(pulse))
        loop.call_later(self.interval, self._sweep, loop)

    async def _beat(self, pulse: InFlight) -> None:
        await pulse.send(_HEAD)
        pulse.head_sent = True
        while True:
            await pulse.send(_SPACE)
            await asyncio.sleep(self.heartbeat_s)


@dataclass(frozen=True)
class ConnectionLimits:
    """What clients may hold of a served app: a connection beyond ``max_connections`` is
    answered 503 and closed; a request's headers must arrive within ``header_timeout_s`` (of
    the connection opening or the previous response) and its body within ``body_timeout_s``;
    an idle keep-alive connection is closed after ``keep_alive_s``.

    ``max_connections`` guards file descriptors, not capacity (rollouts are admitted by
    `RolloutLimits`): None (the default) is what the open-file limit leaves when the server
    starts, once the server's own files are counted.
    """

    max_connections: int | None = None
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    keep_alive_s: float = 5.0


__all__ = ["ConnectionLimits", "DEFAULT_MAX_ROLLOUTS", "DRAIN_VAR", "EarlyHeads",
           "HEAD_AFTER_VAR", "HEARTBEAT_VAR", "InFlight", "MAX_ROLLOUTS_VAR", "RolloutLimits",
           "RolloutStats", "answered_status", "at_capacity", "failure_kind", "rollout_limits",
           "setting_from_env"]
