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


def test_a_caller_names_the_kind_and_redacts_what_is_logged(caplog):
    clock = Clock()
    log = CoalescedLog(logging.getLogger("test.coalesced"), every_s=60, clock=clock)

    def fail(seed: int) -> None:
        raise ValueError(f"seed {seed} failed with key sk-secret")

    with caplog.at_level(logging.ERROR, logger="test.coalesced"):
        for seed in range(3):  # one line raised it: one kind, whatever the messages say
            try:
                fail(seed)
            except ValueError as exc:
                log.error(exc, "run %d failed", seed, kind="fail:1",
                          redact=lambda text: text.replace("sk-secret", "****"))
        clock.now += 60
        log.error(ValueError("seed 9 failed with key sk-secret"), "run %d failed", 9,
                  kind="fail:1", redact=lambda text: text.replace("sk-secret", "****"))
    first, again = caplog.records
    assert first.getMessage().startswith("run 0 failed\nTraceback")
    assert "in fail" in first.getMessage() and first.exc_info is None
    assert again.getMessage() == ("run 9 failed (ValueError: seed 9 failed with key ****: "
                                  "again 3 times in the last 60s)")
    assert "sk-secret" not in caplog.text


def test_a_log_without_tracebacks_says_the_message_alone(caplog):
    log = CoalescedLog(logging.getLogger("test.coalesced"), level=logging.WARNING,
                       tracebacks=False, clock=Clock())
    with caplog.at_level(logging.WARNING, logger="test.coalesced"):
        for _ in range(3):
            log.error(RuntimeError("endpoint down"), "policy: %s", "endpoint down")
    assert [(r.levelno, r.getMessage(), r.exc_info) for r in caplog.records] == [
        (logging.WARNING, "policy: endpoint down", None)]
