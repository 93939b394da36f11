"""`worker_object`: environments built and stepped in worker processes, off the event loop."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from workload import Counter

from synth_deploy.taskapp import worker_object
from synth_deploy.taskapp.workers import WorkerError, WorkerPool


@pytest.fixture
def pool():
    pool = WorkerPool(max_workers=2)
    yield pool
    pool.close()


def test_an_object_keeps_its_state_in_its_own_process(pool):
    async def main():
        async with worker_object(Counter, 10, pool=pool) as counter:
            totals = [await counter.add(n) for n in (1, 2, 3)]
            return totals, await counter.pid()

    totals, pid = asyncio.run(main())
    assert totals == [11, 13, 16] and pid != os.getpid()


def test_the_same_affinity_shares_a_process_and_the_least_loaded_gets_new_objects(pool):
    async def main():
        async with worker_object(Counter, affinity="seed-7", pool=pool) as a, \
                worker_object(Counter, affinity="seed-7", pool=pool) as b, \
                worker_object(Counter, pool=pool) as c, worker_object(Counter, pool=pool) as d:
            return [await x.pid() for x in (a, b, c, d)]

    a, b, c, d = asyncio.run(main())
    # a and b share a process (2 objects); c starts the other one; d joins the less loaded.
    assert a == b and c != a and d == c


def test_the_event_loop_runs_while_a_worker_computes(pool):
    async def main():
        ticks: list[float] = []

        async def ticker():
            while True:
                ticks.append(time.perf_counter())
                await asyncio.sleep(0.005)

        async with worker_object(Counter, pool=pool) as counter:
            await counter.pid()  # started
            task = asyncio.ensure_future(ticker())
            started = time.perf_counter()
            await counter.spin(0.4)
            ended = time.perf_counter()
            task.cancel()
        return [t for t in ticks if started < t < ended]

    assert len(asyncio.run(main())) >= 20  # a thread here would have taken turns with it


def test_errors_come_back_as_raised_and_unsendable_factories_say_why(pool):
    async def fails():
        async with worker_object(Counter, pool=pool) as counter:
            await counter.fail()

    with pytest.raises(LookupError, match="no such seed") as raised:
        asyncio.run(fails())
    assert "raised in worker process" in raised.value.__notes__[0]

    async def local_factory():
        async with worker_object(lambda: Counter(), pool=pool):
            pass

    with pytest.raises(WorkerError, match="cannot send") as refused:
        asyncio.run(local_factory())
    assert "module next to the task app" in refused.value.hint


def test_a_dead_worker_fails_its_calls_and_the_next_object_gets_a_new_one(pool):
    async def main():
        async with worker_object(Counter, affinity=1, pool=pool) as doomed:
            pid = await doomed.pid()
            with pytest.raises(WorkerError, match="exited .code 3. during the call"):
                await doomed.die()
        async with worker_object(Counter, affinity=1, pool=pool) as fresh:
            return pid, await fresh.pid()

    old, new = asyncio.run(main())
    assert old != new
