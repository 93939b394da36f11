"""`deadline`: asyncio.timeout's behaviour, with timers shared between deadlines."""

from __future__ import annotations

import asyncio
import time

import pytest

from synth_deploy.deadlines import SLOT_S, deadline


def test_an_overrun_is_a_timeout_never_early_at_most_a_slot_late():
    async def main():
        started = time.perf_counter()
        with pytest.raises(TimeoutError):
            with deadline(0.2):
                await asyncio.sleep(5)
        return time.perf_counter() - started

    took = asyncio.run(main())
    assert 0.2 <= took < 0.2 + SLOT_S + 0.15


def test_a_body_that_finishes_in_time_is_untouched_and_its_slot_does_not_fire_later():
    async def main():
        with deadline(0.05):
            await asyncio.sleep(0)
        await asyncio.sleep(0.2)  # past the deadline: nothing may cancel this task now
        return "done"

    assert asyncio.run(main()) == "done"


def test_deadlines_sharing_a_slot_each_cancel_only_their_own_task():
    async def bounded(seconds, sleep):
        try:
            with deadline(seconds):
                await asyncio.sleep(sleep)
            return "ok"
        except TimeoutError:
            return "timeout"

    async def main():
        return await asyncio.gather(bounded(0.1, 1), bounded(0.1, 0.01), bounded(0.1, 1),
                                    bounded(None, 0.3))

    assert asyncio.run(main()) == ["timeout", "ok", "timeout", "ok"]


def test_a_cancellation_from_elsewhere_stays_a_cancellation():
    async def main():
        async def worker():
            with deadline(10):
                await asyncio.sleep(5)

        task = asyncio.ensure_future(worker())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_an_inner_deadline_fires_first_and_the_outer_one_still_holds():
    async def main():
        inner_timed_out = False
        with pytest.raises(TimeoutError):
            with deadline(0.3):
                try:
                    with deadline(0.1):
                        await asyncio.sleep(5)
                except TimeoutError:
                    inner_timed_out = True
                await asyncio.sleep(5)
        return inner_timed_out

    assert asyncio.run(main()) is True
