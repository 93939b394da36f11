"""`AsyncRollouts`: rollouts that outlive the request that started them.

A rollout is submitted (by id), runs as a task of its own, and is answered by id: its state,
its events, its result. What makes it durable:

- **admission**: it is counted in flight like a ``/rollout`` (the same `RolloutStats`), from
  its submission to its end; past the capacity the submission is refused (503).
- **idempotent ids**: the same id with the same body is answered from the first submission
  (``replayed: true``), running or done; the same id with another body is refused (409).
- **a lease**: the client holds the rollout by asking after it (any read of it, or
  ``POST .../renew``); a rollout nobody asked after for its lease's ``ttl_seconds`` is
  cancelled, and its trace says so (``status: cancelled``, ``error.code: lease_expired``).
- **shared records**: with a store of records (`SharedRecords`: the trace store's
  `RolloutRecords`, or on Modal a `modal.Dict`, see `synth_deploy.modal`), each rollout's
  record is claimed there when it starts (atomically: of two servers claiming one id, one
  runs it) and its answer stored when it ends. Every server on that store answers for it:
  its state, result, events and stream from the record, a read or renew there holding its
  lease, a terminate there stopping it (its runner reads both at its tick, every
  `TICK_S`). A rollout whose runner stopped beating (`RUNNER_LOST_S`) answers
  ``interrupted`` (never 404, never a hang), and never while its runner lives. Without a
  store, records live in memory only.
- **bounded memory**: a finished rollout is answered from memory (its events in full, its
  answer kept as its record keeps it: `_document.compact`) for `FINISHED_KEPT_S` at
  most; past the `FINISHED_KEPT` newest, one is let go once its end
  was read (or its lease ran out unread). After that it is answered from its stored record
  (its start and end as events), or, with no store, not at all (404).
- **a terminal state, whatever stop lands when**: a rollout's status is written and its
  slot given back once, in `_finish`, which a stop cannot reach (`RolloutStop.final`).
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Protocol

import anyio

from synth_deploy.serving._admission import RolloutStats, at_capacity
from synth_deploy.serving._correlation import correlation_id
from synth_deploy.serving._rollout_run import (
    KIT,
    RolloutFailure,
    RolloutOutcome,
    RolloutStop,
    stopped,
)
from synth_deploy.serving.containers._document import compact, expanded, result_fields
from synth_deploy.serving.containers._events import envelope
from synth_deploy.taskapp.contracts import RolloutRequest, RolloutResponse
from synth_deploy.tracing import (
    RUNNER_LOST_S,
    TICK_S,
    RolloutClaim,
    RolloutFinish,
    RolloutRecord,
    RunnerNews,
)

RunRollout = Callable[[RolloutRequest, bytes, RolloutStop], Awaitable[RolloutOutcome]]
DEFAULT_LEASE_S = 300.0
# How long, and how many, finished rollouts stay in memory (README, "Durable rollouts").
FINISHED_KEPT_S = 600.0
FINISHED_KEPT = 1_000
TERMINAL = ("completed", "failed", "cancelled", "interrupted")
# synth-containers' success_status for each status (its wire.py), and ours for `interrupted`.
_SUCCESS = {"running": "running", "completed": "success", "failed": "failed",
            "cancelled": "cancelled", "interrupted": "interrupted"}
# Fields of a submission that do not make it another request: how it is waited for and held.
_NOT_IDENTITY = ("submission_mode", "lease_ttl_seconds")


# How often a runner prunes its app's finished records in the store.
PRUNE_EVERY_S = 3_600.0


class SharedRecords(Protocol):
    """Where servers keep the records of their async rollouts and find each other's
    (`synth_deploy.tracing.RolloutRecords`, the Modal Dict's records). Blocking calls, run
    off the event loop; every one names the app, so apps sharing a store never meet."""

    def apply(self, app_id: str, owner: str, claims: list[RolloutClaim],
              finishes: list[RolloutFinish], now: float) -> dict[str, RolloutRecord]:
        """Claim and finish at once (``owner``'s heartbeat with them); the record already
        there for each claim another holds."""

    def get(self, app_id: str, rollout_id: str) -> RolloutRecord | None: ...

    def touch(self, app_id: str, rollout_id: str, now: float, ttl_s: float | None = None
              ) -> None:
        """A client asked after a running rollout here: its lease holds from ``now``."""

    def request_stop(self, app_id: str, rollout_id: str, reason: str) -> None: ...

    def news(self, app_id: str, owner: str, asked: list[str], now: float) -> RunnerNews:
        """``owner``'s tick: its heartbeat, the stops asked of its rollouts, the touches of
        those ``asked``."""

    def prune(self, app_id: str, now: float) -> None: ...

    def retire(self, owner: str) -> None:
        """``owner`` stops: the rollouts it still runs are lost now, not once it is silent."""


def iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).isoformat()


class Refused(Exception):
    """A submission the server will not run (or a rollout it cannot read back): ``status``
    and ``code`` say why."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def request_digest(body: dict[str, Any]) -> str:
    """What tells one submission from another under the same id."""
    identity = {k: v for k, v in body.items() if k not in _NOT_IDENTITY}
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class _Live:
    """A rollout this server runs (or ran): its document, events and lease."""

    __slots__ = ("rollout_id", "digest", "mode", "created_at", "updated_at", "status", "answer",
                 "compact", "http_status", "events", "changed", "task", "ttl_s", "expires",
                 "stop", "req", "request_json", "read", "correlation_id")

    def __init__(self, rollout_id: str, digest: str, mode: str, req: RolloutRequest,
                 request_json: bytes, ttl_s: float, now: float) -> None:
        self.rollout_id, self.digest, self.mode = rollout_id, digest, mode
        self.req, self.request_json = req, request_json
        # Kept apart: the request is let go once the rollout has its answer.
        self.correlation_id = correlation_id(req.policy.config) or rollout_id
        self.created_at = self.updated_at = iso(now)  # text once: polls read it often
        self.status = "running"
        self.answer: dict[str, Any] = {}  # the result's fields, once it has one
        self.compact = False  # the answer is kept as its record is (`keep_compact`)
        self.http_status = 202
        self.events: list[dict[str, Any]] = []
        self.changed = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.ttl_s = ttl_s
        self.expires = time.monotonic() + ttl_s
        self.stop = RolloutStop()  # its task is set once the rollout's task takes it
        self.read = False  # its end was answered to someone: it may be let go

    @property
    def done(self) -> bool:
        return self.status in TERMINAL

    def event(self, kind: str, **data: Any) -> None:
        self.events.append(envelope(self.rollout_id, kind, len(self.events) + 1, data))
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()  # wakes whoever waits for news of this rollout

    def renew(self) -> None:
        self.expires = time.monotonic() + self.ttl_s

    def document(self) -> dict[str, Any]:
        """Its document in the contract's terms (`_document`): a result's trace, token
        turns and artifacts are made once, when it is first read."""
        doc: dict[str, Any] = {
            "rollout_id": self.rollout_id, "status": self.status,
            "success_status": _SUCCESS[self.status], "status_detail": self.status,
            "trace_correlation_id": self.correlation_id,
            "created_at": self.created_at, "updated_at": self.updated_at,
            "metadata": {"submission_mode": self.mode}, "summary": {}}
        if not self.done:
            doc["lease"] = {"ttl_seconds": self.ttl_s,
                            "expires_in_s": round(max(0.0, self.expires - time.monotonic()), 3),
                            "renew_route": f"/rollouts/{self.rollout_id}/renew"}
        doc.update(self.fields())
        return doc

    def fields(self) -> dict[str, Any]:
        """The answer's fields in the contract's terms."""
        if self.compact:
            return expanded(self.answer)
        if "response" in self.answer and "turns" not in self.answer:
            self.answer = result_fields(self.answer, self.rollout_id)
        return self.answer

    def keep_compact(self) -> dict[str, Any]:
        """Its document as its record keeps it (`compact`), and its answer kept so from now
        on: a long episode's trace and token turns, whole, grow with the square of its
        turns, and a finished rollout stays in memory for minutes."""
        fields = self.fields()
        document = compact(self.document())
        self.answer = {name: document[name] for name in fields}
        self.compact = True
        return document


class _RecordBatches:
    """Claims and finishes on their way to the store: whatever waits goes in one
    transaction, on one worker thread, while the loop serves (a thousand submissions in a
    second cost a few commits, not a thousand thread hops)."""

    def __init__(self, records: SharedRecords, app_id: str, owner: str) -> None:
        self.records, self.app_id, self.owner = records, app_id, owner
        self.claims: list[tuple[RolloutClaim, asyncio.Future[Any]]] = []
        self.finishes: list[tuple[RolloutFinish, asyncio.Future[Any]]] = []
        self.task: asyncio.Task[None] | None = None

    async def claim(self, claim: RolloutClaim) -> RolloutRecord | None:
        return await self._queued(self.claims, claim)

    async def finish(self, finish: RolloutFinish) -> None:
        await self._queued(self.finishes, finish)

    async def _queued(self, queue: list[Any], item: Any) -> Any:
        future = asyncio.get_running_loop().create_future()
        queue.append((item, future))
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self.claims or self.finishes:
            claims, self.claims = self.claims, []
            finishes, self.finishes = self.finishes, []
            waiting = [f for _, f in claims] + [f for _, f in finishes]
            try:
                found = await anyio.to_thread.run_sync(
                    self.records.apply, self.app_id, self.owner, [c for c, _ in claims],
                    [f for f, _ in finishes], time.time())
            except Exception as exc:  # noqa: BLE001 - each waiter raises it
                for future in waiting:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for claim, future in claims:
                if not future.done():
                    future.set_result(found.get(claim.rollout_id))
            for _, future in finishes:
                if not future.done():
                    future.set_result(None)


class AsyncRollouts:
    """The rollouts submitted to one served app (see the module docstring).

    ``run`` runs a validated request to its outcome (`RolloutRun.run`: its bound, its
    trace, its stop); ``records``: where records are kept past this process (None: memory
    only).
    """

    def __init__(self, run: RunRollout, *, stats: RolloutStats, records: SharedRecords | None,
                 app_id: str = "", default_ttl_s: float = DEFAULT_LEASE_S) -> None:
        self.run, self.stats, self.records = run, stats, records
        self.app_id = app_id
        self.default_ttl_s = default_ttl_s
        self.owner = uuid.uuid4().hex  # this process: its records' runner, while it beats
        self._batches = None if records is None else _RecordBatches(records, app_id,
                                                                    self.owner)
        self._heard = self._pruned = 0.0  # when this runner last beat, last pruned (monotonic)
        self._ticking = self._retired = False
        self.live: dict[str, _Live] = {}
        # Finished rollouts still in `live`, oldest first: (when each finished, it).
        self.finished: collections.deque[tuple[float, _Live]] = collections.deque()
        self.finished_kept, self.finished_kept_s = FINISHED_KEPT, FINISHED_KEPT_S
        self._trimming: asyncio.TimerHandle | None = None
        self._sweeping: asyncio.AbstractEventLoop | None = None

    @property
    def durable(self) -> bool:
        return self.records is not None

    async def submit(self, req: RolloutRequest, request_json: bytes, digest: str, *,
                     mode: str, ttl_s: float | None) -> tuple[dict[str, Any], bool, _Live | None]:
        """Start ``req`` (its id: ``req.run_id``), or find the submission it repeats.
        Returns (its document, whether it was replayed, its live rollout when this server
        runs it); raises `Refused` (409: the id is another request's; 503: at capacity)."""
        rollout_id = req.run_id
        live = self.live.get(rollout_id)
        if live is not None:
            return self._replay(live.digest, digest, rollout_id, live.document()), True, live
        stats = self.stats
        stats.rollout_requests += 1
        if not stats.admit():  # the same slots as /rollout's
            status, code, message, _ = at_capacity(stats.capacity)
            raise Refused(status, code, message)
        now = time.time()
        live = _Live(rollout_id, digest, mode, req, request_json, ttl_s or self.default_ttl_s,
                     now)
        self.live[rollout_id] = live  # held before any await: a second claim finds it
        if self._batches is not None:
            try:
                found = await self._batches.claim(RolloutClaim(rollout_id, digest, self.owner,
                                                               now, live.ttl_s))
            except Exception as exc:
                self._release(live)
                raise Refused(500, "record_write_failed",
                              f"rollout {rollout_id} was not started: its record could not be "
                              f"stored ({type(exc).__name__}); see the server's log") from exc
            except BaseException:
                self._release(live)
                raise
            if found is not None:  # submitted before this process started (or elsewhere)
                self._release(live)
                return self._replay(found.digest, digest, rollout_id,
                                    self._stored_document(found)), True, None
        live.event("rollout.accepted", submission_mode=mode, lease_ttl_seconds=live.ttl_s)
        live.task = asyncio.get_running_loop().create_task(self._execute(live))
        self._sweep_leases()
        return live.document(), False, live

    def _release(self, live: _Live) -> None:
        del self.live[live.rollout_id]
        self.stats.release()

    @staticmethod
    def _replay(first: str, digest: str, rollout_id: str, document: dict[str, Any]
                ) -> dict[str, Any]:
        if first != digest:
            raise Refused(409, "rollout_identity_conflict",
                          f"rollout {rollout_id} was submitted with another request; give "
                          "this one a new rollout_id, or resend the first request as it was")
        return {**document, "replayed": True}

    async def find(self, rollout_id: str, *, renew: bool = True) -> dict[str, Any] | None:
        """The document of ``rollout_id`` (asking after it renews its lease, wherever it
        runs), or None when no rollout has the id."""
        live = self.live.get(rollout_id)
        if live is not None:
            if renew and not live.done:
                live.renew()
            live.read = live.done
            return live.document()
        found = await self._stored(rollout_id)
        if found is None:
            return None
        now = time.time()
        if renew and self._held(found, now) and (
                found.touched_at is None or now - found.touched_at > (found.ttl_s or 0) / 8):
            await self._on_store(self.records.touch, self.app_id, rollout_id, now)
            found = replace(found, touched_at=now)
        return self._stored_document(found, now)

    async def _stored(self, rollout_id: str) -> RolloutRecord | None:
        if self.records is None:
            return None
        return await self._on_store(self.records.get, self.app_id, rollout_id)

    async def _on_store(self, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return await anyio.to_thread.run_sync(call, *args)
        except Exception as exc:
            raise Refused(500, "record_read_failed",
                          f"rollout {args[1]}'s record could not be read or written "
                          f"({type(exc).__name__}); see the server's log") from exc

    def _held(self, found: RolloutRecord, now: float) -> bool:
        """A record another server runs, alive: asks of it go to its runner."""
        return found.status == "running" and not found.lost(self.owner, now)

    def _stored_document(self, found: RolloutRecord, now: float | None = None
                         ) -> dict[str, Any]:
        if found.result is not None:
            return expanded(found.result)
        now = time.time() if now is None else now
        document: dict[str, Any] = {
            "rollout_id": found.rollout_id, "status": found.status,
            "success_status": _SUCCESS.get(found.status, found.status),
            "created_at": found.created_at, "updated_at": found.updated_at,
            "metadata": {}, "summary": {}}
        if found.lost(self.owner, now):
            document.update(status="interrupted", success_status="interrupted",
                            status_detail="the server running it stopped before it finished; "
                                          "submit it again under a new rollout_id")
        elif found.status == "running" and found.ttl_s:
            held_from = found.touched_at or 0.0
            document["lease"] = {"ttl_seconds": found.ttl_s,
                                 "expires_in_s": round(max(0.0, held_from + found.ttl_s - now),
                                                       3),
                                 "renew_route": f"/rollouts/{found.rollout_id}/renew"}
        return document

    async def renew(self, rollout_id: str, ttl_s: float | None) -> dict[str, Any] | None:
        live = self.live.get(rollout_id)
        if live is None:
            found = await self._stored(rollout_id)
            now = time.time()
            if found is not None and self._held(found, now):
                await self._on_store(self.records.touch, self.app_id, rollout_id, now, ttl_s)
                found = replace(found, touched_at=now, ttl_s=ttl_s or found.ttl_s)
            return None if found is None else self._stored_document(found, now)
        if not live.done:
            if ttl_s is not None:
                live.ttl_s = ttl_s
            live.renew()
            live.event("rollout.lease.renewed", ttl_seconds=live.ttl_s)
        return live.document()

    async def terminate(self, rollout_id: str, reason: str) -> dict[str, Any] | None:
        live = self.live.get(rollout_id)
        if live is None:  # another server's: its runner stops it at its next tick
            found = await self._stored(rollout_id)
            now = time.time()
            if found is not None and self._held(found, now):
                await self._on_store(self.records.request_stop, self.app_id, rollout_id,
                                     reason)
            return None if found is None else self._stored_document(found, now)
        self._cancel(live, reason)
        return live.document()

    def _cancel(self, live: _Live, reason: str) -> None:
        if not live.done:
            live.stop.request(reason)  # nothing once its outcome is final

    async def wait(self, live: _Live, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for news of ``live``; True when there was some."""
        if live.done:
            return True
        try:
            await asyncio.wait_for(live.changed.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def _execute(self, live: _Live) -> None:
        stop = live.stop
        stop.task = asyncio.current_task()
        if stop.reason is not None:  # stopped before its task began: it never runs
            outcome = RolloutOutcome(live.rollout_id, failure=stopped(stop.reason,
                                                                      live.rollout_id))
        else:
            try:
                outcome = await self.run(live.req, live.request_json, stop)
            except asyncio.CancelledError:
                # The server is stopping: the record stays `running`, and this runner says
                # it is gone, so every server answers it as interrupted from now on.
                self.stats.release()
                self._retire()
                raise
            except Exception as exc:  # the kit's own failure: the app's are in the outcome
                outcome = RolloutOutcome(live.rollout_id, failure=RolloutFailure(
                    500, "server_error", f"{type(exc).__name__} while running the rollout",
                    KIT, True))
        failure = outcome.failure
        if failure is None:
            assert outcome.result is not None
            await self._finish(live, "completed", 200,
                               _completed_fields(outcome.result, self.app_id))
            return
        await self._finish(live, "cancelled" if failure.cancelled else "failed",
                           failure.status, {"status_detail": failure.message,
                                            "error": {**failure.error(),
                                                      "status": failure.status}})

    async def _finish(self, live: _Live, status: str, http_status: int,
                      answer: dict[str, Any]) -> None:
        """Set ``live``'s terminal ``status`` (its waiters answered at once: its trace is
        stored already), then store its record; whatever happens meanwhile, its slot is
        given back."""
        updated = time.time()
        live.updated_at = iso(updated)
        live.answer, live.http_status = answer, http_status
        live.status = status
        live.event(f"rollout.{status}", http_status=http_status)
        try:
            try:
                document = live.keep_compact()
                if self._batches is not None:
                    await self._batches.finish(RolloutFinish(
                        live.rollout_id, status, document, updated))
            except Exception as exc:  # noqa: BLE001 - answered in memory, said in it
                live.answer = {**live.answer, "warning": f"its record could not be stored "
                                                         f"({type(exc).__name__})"}
        finally:
            self.stats.release()
            live.req, live.request_json = None, b""  # only its answer is read from now on
            self.finished.append((time.monotonic(), live))
            self._trim()

    def _retire(self) -> None:
        if self.records is None or self._retired:
            return
        self._retired = True
        try:  # on the loop, once: it is closing, and nothing else waits on it
            self.records.retire(self.owner)
        except Exception:  # noqa: BLE001 - then its rollouts are lost once it is silent
            pass

    def _trim(self) -> None:
        """Let go of finished rollouts: any past `finished_kept_s`; past the newest
        `finished_kept`, those whose end was read or whose lease ran out unread (a client
        polling a crowd that all ended at once reads each end). A timer comes back for the
        oldest one left."""
        finished, live = self.finished, self.live
        now = time.monotonic()
        while finished:
            ended, oldest = finished[0]
            if not (now - ended >= self.finished_kept_s or len(finished) > self.finished_kept
                    and (oldest.read or now - ended >= oldest.ttl_s)):
                break
            finished.popleft()
            if live.get(oldest.rollout_id) is oldest:
                del live[oldest.rollout_id]
        if finished and self._trimming is None:
            ended, oldest = finished[0]
            due = ended + min(self.finished_kept_s, oldest.ttl_s) - now
            self._trimming = asyncio.get_running_loop().call_later(max(0.05, due),
                                                                   self._trim_timer)

    def _trim_timer(self) -> None:
        self._trimming = None
        self._trim()

    def _sweep_leases(self) -> None:
        loop = asyncio.get_running_loop()
        if self._sweeping is loop:
            return
        self._sweeping = loop
        loop.call_later(self._sweep_interval(), self._sweep, loop)

    def _sweep_interval(self) -> float:
        shortest = min((live.ttl_s for live in self.live.values() if not live.done),
                       default=self.default_ttl_s)
        return min(TICK_S, shortest / 4)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._sweeping is not loop:
            return
        now = time.monotonic()
        running = False
        expired = []
        for live in list(self.live.values()):
            if live.done:
                continue
            running = True
            if live.expires <= now:
                expired.append(live)
        if not running:
            self._sweeping = None  # the next submission starts a new sweep
            return
        if self.records is None:
            for live in expired:
                self._cancel(live, "lease_expired")
        elif not self._ticking and (expired or now - self._heard >= TICK_S):
            # A lease may be held on another server: the store says, and a stop asked
            # there, and this runner's heartbeat goes with it.
            self._ticking = True
            loop.create_task(self._tick(expired))
        loop.call_later(self._sweep_interval(), self._sweep, loop)

    async def _tick(self, expired: list[_Live]) -> None:
        """This runner's beat in the store, and what other servers asked of its rollouts."""
        assert self.records is not None
        try:
            started = time.monotonic()
            now = time.time()
            try:
                news = await anyio.to_thread.run_sync(
                    self.records.news, self.app_id, self.owner,
                    [live.rollout_id for live in expired], now)
            except Exception:  # noqa: BLE001 - the store is away: leases run out as they are
                news = RunnerNews({}, {})
            else:
                self._heard = started
            for rollout_id, reason in news.stops.items():
                live = self.live.get(rollout_id)
                if live is not None and reason in ("terminated", "lease_expired"):
                    self._cancel(live, reason)
            for live in expired:
                touched = news.touched.get(live.rollout_id)
                if touched is not None:  # asked after elsewhere: held from then
                    at, ttl_s = touched
                    live.ttl_s = ttl_s or live.ttl_s
                    live.expires = max(live.expires, started - (now - at) + live.ttl_s)
                if live.expires <= time.monotonic():
                    self._cancel(live, "lease_expired")
            if started - self._pruned >= PRUNE_EVERY_S:
                self._pruned = started
                try:
                    await anyio.to_thread.run_sync(self.records.prune, self.app_id, now)
                except Exception:  # noqa: BLE001 - pruned at the next chance
                    self._pruned = 0.0
        finally:
            self._ticking = False


def _completed_fields(result: RolloutResponse, task_id: str) -> dict[str, Any]:
    """A completed rollout's answer in synth-containers' terms, with the kit's own answer
    (a synth-ai RolloutResponse) as ``response``."""
    response = result.model_dump(mode="json")
    metrics = response.get("metrics") or {}
    reward = metrics.get("outcome_reward")
    details = metrics.get("details") or {}
    tokens = details.get("tokens")
    return {
        "task_id": task_id,
        "reward_info": {"outcome_reward": reward,
                        "event_rewards": metrics.get("event_rewards") or [],
                        "details": {"objective": "outcome_reward"}},
        "objective_scores": [] if reward is None else [
            {"objective": "outcome_reward", "value": reward, "source": "container.reward_info"}],
        "summary": {"reward": reward, "num_steps": metrics.get("num_steps")},
        "usage": {} if tokens is None else {"total_tokens": tokens},
        "trace_correlation_id": response.get("trace_correlation_id"),
        "trace": response.get("trace") or {},  # when the request asked for it (record)
        "response": response,
    }


__all__ = ["AsyncRollouts", "DEFAULT_LEASE_S", "RUNNER_LOST_S", "Refused", "SharedRecords",
           "TERMINAL", "request_digest"]
