"""Async rollouts' records every container of a deployment shares: a `modal.Dict`.

A deployment is as many containers as Modal's autoscaler starts, and a client's next request
lands on any of them; the records of its async rollouts (synth-containers' contract) live in
one Dict named after the app (`rollout_dict_name`), which the container entry opens when the
plan names it (`ROLLOUT_DICT_VAR`). `DictRolloutRecords` is the same `SharedRecords` the
trace store's `RolloutRecords` is off Modal (see infra/modal.md for why a Dict and not
``spawn`` with ``FunctionCall`` polling), over a Dict's documented operations only:

- ``put(key, value, skip_if_exists=True)`` is the claim: the Dict's server adds the entry
  only if the key is absent and says whether it did, so of two containers claiming one id,
  one runs it. Each record is written by its runner alone after that (its end).
- What other containers ask of a running rollout never rewrites its record (a get-then-put
  by two writers would lose one): a read or renew puts its own ``touch`` entry; a terminate
  puts a message in its runner's mailbox, slot ``n`` claimed with ``skip_if_exists`` so two
  terminates never share one; the runner reads both at its tick.
- The runner's heartbeat is an entry of its own (``runner``); a clean stop pops it, so its
  rollouts answer ``interrupted`` at once.
- Entries live 7 days after their last read or write (Modal's Dict), which is the records'
  retention; nothing else prunes them.

Values are plain JSON-able dicts and floats; keys are strings.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from synth_deploy.tracing import RolloutClaim, RolloutFinish, RolloutRecord, RunnerNews

ROLLOUT_DICT_VAR = "SYNTH_DEPLOY_ROLLOUT_DICT"  # the Dict's name, set by the deploy plan
RUNNING = "running"
_MAILBOX_PROBES = 10_000  # slots a terminate tries past its hint before it gives up


def rollout_dict_name(app_name: str) -> str:
    """The Dict that holds the async rollouts of Modal app ``app_name``."""
    return f"{app_name}-rollouts"


def iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).isoformat()


def _key(kind: str, *parts: str) -> str:
    return json.dumps([kind, *parts], separators=(",", ":"))


class DictRolloutRecords:
    """`SharedRecords` over ``store``: a `modal.Dict` (or anything with its ``get``,
    ``put(skip_if_exists=)`` and ``pop``). Blocking calls: a server runs them off its loop."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._read: dict[str, int] = {}  # each runner's next mailbox slot (this process's)

    def apply(self, app_id: str, owner: str, claims: list[RolloutClaim],
              finishes: list[RolloutFinish], now: float) -> dict[str, RolloutRecord]:
        store = self.store
        store.put(_key("runner", owner), now)
        found: dict[str, RolloutRecord] = {}
        for claim in claims:
            record = {"digest": claim.digest, "status": RUNNING, "owner": claim.owner,
                      "created_at": iso(claim.at), "updated_at": iso(claim.at),
                      "result": None, "ttl_s": claim.ttl_s, "at": claim.at}
            key = _key("rollout", app_id, claim.rollout_id)
            if not store.put(key, record, skip_if_exists=True):
                there = self.get(app_id, claim.rollout_id)
                if there is not None:
                    found[claim.rollout_id] = there
        for finish in finishes:
            key = _key("rollout", app_id, finish.rollout_id)
            record = store.get(key) or {"digest": "", "owner": owner, "created_at": ""}
            store.put(key, {**record, "status": finish.status, "result": finish.result,
                            "updated_at": iso(finish.at)})
            store.pop(_key("touch", app_id, finish.rollout_id), None)
        return found

    def get(self, app_id: str, rollout_id: str) -> RolloutRecord | None:
        record = self.store.get(_key("rollout", app_id, rollout_id))
        if record is None:
            return None
        touched_at, ttl_s, seen = None, record.get("ttl_s"), None
        if record.get("status") == RUNNING:
            seen = self.store.get(_key("runner", record["owner"]))
            touch = self.store.get(_key("touch", app_id, rollout_id))
            touched_at = record.get("at")
            if touch is not None:
                touched_at, ttl_s = touch["at"], touch.get("ttl_s") or ttl_s
        return RolloutRecord(rollout_id, record["digest"], record["status"], record["owner"],
                             record["created_at"], record["updated_at"], record.get("result"),
                             touched_at, ttl_s, None, seen)

    def touch(self, app_id: str, rollout_id: str, now: float, ttl_s: float | None = None
              ) -> None:
        key = _key("touch", app_id, rollout_id)
        if ttl_s is None:
            before = self.store.get(key)
            ttl_s = before.get("ttl_s") if before else None
        self.store.put(key, {"at": now, "ttl_s": ttl_s})

    def request_stop(self, app_id: str, rollout_id: str, reason: str) -> None:
        record = self.store.get(_key("rollout", app_id, rollout_id))
        if record is None or record.get("status") != RUNNING:
            return
        owner = record["owner"]
        slot = int(self.store.get(_key("mailbox-next", owner)) or 0)
        message = {"app_id": app_id, "rollout_id": rollout_id, "reason": reason}
        for n in range(slot, slot + _MAILBOX_PROBES):
            if self.store.put(_key("mailbox", owner, str(n)), message, skip_if_exists=True):
                return
        raise RuntimeError(f"runner {owner}'s mailbox has no free slot past {slot}")

    def news(self, app_id: str, owner: str, asked: list[str], now: float) -> RunnerNews:
        store = self.store
        store.put(_key("runner", owner), now)
        stops: dict[str, str] = {}
        n = self._read.get(owner, 0)
        while (message := store.get(_key("mailbox", owner, str(n)))) is not None:
            if message.get("app_id") == app_id:
                stops[message["rollout_id"]] = message["reason"]
            n += 1
        if n != self._read.get(owner, 0):
            self._read[owner] = n
            store.put(_key("mailbox-next", owner), n)  # where the next terminate starts
        touched = {}
        for rollout_id in asked:
            touch = store.get(_key("touch", app_id, rollout_id))
            if touch is not None:
                touched[rollout_id] = (touch["at"], touch.get("ttl_s"))
        return RunnerNews(stops, touched)

    def prune(self, app_id: str, now: float) -> None:
        """Nothing to do: the Dict lets an entry go 7 days after its last use."""

    def retire(self, owner: str) -> None:
        self.store.pop(_key("runner", owner), None)


__all__ = ["DictRolloutRecords", "ROLLOUT_DICT_VAR", "rollout_dict_name"]
