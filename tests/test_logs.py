"""`CoalescedLog`: a failure repeated on every request is logged once, then counted."""

from __future__ import annotations

import logging

from synth_deploy.logs import MAX_KINDS, CoalescedLog


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_repeated_failure_is_logged_whole_once_then_counted_once_a_window(caplog):
    clock = Clock()
    log = CoalescedLog(logging.getLogger("test.coalesced"), every_s=60, clock=clock)
    full = OSError(28, "No space left on device")
    with caplog.at_level(logging.ERROR, logger="test.coalesced"):
        for i in range(1000):
            clock.now += 0.01
            log.error(full, "write %d failed", i)
        clock.now += 60
        log.error(full, "write %d failed", 1000)
    assert [r.getMessage() for r in caplog.records] == [
        "write 0 failed",
        "write 1000 failed (OSError: [Errno 28] No space left on device: again 1000 times in "
        "the last 70s)"]
    assert caplog.records[0].exc_info is not None and caplog.records[1].exc_info is None


def test_each_kind_of_failure_is_said_once(caplog):
    log = CoalescedLog(logging.getLogger("test.coalesced"), clock=Clock())
    with caplog.at_level(logging.ERROR, logger="test.coalesced"):
        for _ in range(3):
            log.error(OSError("disk full"), "a")
            log.error(OSError("database is locked"), "b")
            log.error(ValueError("disk full"), "c")
    assert [r.getMessage() for r in caplog.records] == ["a", "b", "c"]


def test_it_remembers_a_bounded_number_of_kinds(caplog):
    log = CoalescedLog(logging.getLogger("test.coalesced"), clock=Clock())
    with caplog.at_level(logging.ERROR, logger="test.coalesced"):
        for i in range(MAX_KINDS + 1):
            log.error(RuntimeError(f"failure {i}"), "x")
        log.error(RuntimeError("failure 0"), "x")  # forgotten: said again
        log.error(RuntimeError(f"failure {MAX_KINDS}"), "x")  # remembered: not
    assert len(caplog.records) == MAX_KINDS + 2
