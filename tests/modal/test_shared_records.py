"""Async rollouts' records in a Modal Dict (`DictRolloutRecords`), against the Dict stand-in
service (tests/standins/modal_dict.py, a process of its own following Modal's documented
semantics): one claim wins among many at once, asks reach the runner through its own
entries, a retired runner's rollouts are lost at once, entries expire when idle."""

from __future__ import annotations

import subprocess
import sys
import time
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from standins import modal_dict

from synth_deploy.modal import DictRolloutRecords
from synth_deploy.tracing import RUNNER_LOST_S, RolloutClaim, RolloutFinish

STANDIN = Path(modal_dict.__file__)


@pytest.fixture
def dict_service(tmp_path):
    """service(idle_s) -> a modal-like module whose Dict talks to a fresh service."""
    procs = []

    def start(idle_s: float = 604800.0):
        port_file = tmp_path / f"dict-{len(procs)}.port"
        proc = subprocess.Popen([sys.executable, str(STANDIN), str(port_file), str(idle_s)])
        procs.append(proc)
        deadline = time.monotonic() + 15
        while not port_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        client = types.ModuleType("modal")
        modal_dict.install(client, f"http://127.0.0.1:{port_file.read_text()}")
        return client

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(10)


def test_one_claim_wins_among_many_at_once_and_records_are_the_apps_own(dict_service):
    modal = dict_service()
    store = modal.Dict.from_name("app-rollouts", create_if_missing=True)
    owners = [DictRolloutRecords(store) for _ in range(4)]

    def claim(args):
        n, records = args
        return n, records.apply("math", f"owner-{n}", [RolloutClaim(f"r-{i}", "d", f"owner-{n}",
                                                                    1.0) for i in range(40)],
                                [], time.time())

    with ThreadPoolExecutor(4) as pool:
        found = dict(pool.map(claim, enumerate(owners)))
    won = {f"r-{i}": [n for n in found if f"r-{i}" not in found[n]] for i in range(40)}
    assert all(len(winners) == 1 for winners in won.values()), won
    reader = DictRolloutRecords(store)
    assert reader.get("math", "r-0").owner == f"owner-{won['r-0'][0]}"
    assert reader.get("other-app", "r-0") is None  # another app's ids are not its own


def test_touches_stops_heartbeats_and_a_retired_runner(dict_service):
    modal = dict_service()
    store = modal.Dict.from_name("app-rollouts", create_if_missing=True)
    runner, elsewhere = DictRolloutRecords(store), DictRolloutRecords(store)
    now = time.time()
    runner.apply("math", "runner", [RolloutClaim("a", "d", "runner", now, 5.0),
                                    RolloutClaim("b", "d", "runner", now, 5.0)], [], now)
    record = elsewhere.get("math", "a")
    assert record.status == "running" and not record.lost("elsewhere", now + 1)
    assert record.lost("elsewhere", now + RUNNER_LOST_S + 1)  # silent that long: gone
    elsewhere.touch("math", "a", now + 2, 30.0)
    elsewhere.request_stop("math", "b", "terminated")
    elsewhere.request_stop("math", "b", "terminated")  # twice: two slots, never one lost
    news = runner.news("math", "runner", ["a"], now + 3)
    assert news.stops == {"b": "terminated"} and news.touched == {"a": (now + 2, 30.0)}
    assert runner.news("math", "runner", [], now + 4).stops == {}  # read once
    runner.apply("math", "runner", [], [RolloutFinish("b", "cancelled", {"status": "cancelled"},
                                                      now + 5)], now + 5)
    assert elsewhere.get("math", "b").result == {"status": "cancelled"}
    runner.retire("runner")
    assert elsewhere.get("math", "a").lost("elsewhere", now + 6)  # at once, not in 10 s


def test_entries_expire_when_idle_and_a_missing_dict_is_not_found(dict_service):
    modal = dict_service(idle_s=0.3)
    with pytest.raises(modal.exception.NotFoundError):
        modal.Dict.from_name("never-made")
    store = modal.Dict.from_name("d", create_if_missing=True)
    assert store.put("k", {"v": 1}, skip_if_exists=True) is True
    assert store.put("k", {"v": 2}, skip_if_exists=True) is False
    assert store.get("k") == {"v": 1}
    time.sleep(0.5)
    assert store.get("k") is None and store.put("k", 3, skip_if_exists=True) is True
    assert store.pop("k") == 3 and store.pop("k", None) is None
