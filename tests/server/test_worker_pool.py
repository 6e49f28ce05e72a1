"""WorkerPool: work runs off the event loop (the loop keeps turning meanwhile), results and
errors come back, a deadline ends the wait (saying whether the work had started, and a job
that had not is never run), and a full pool refuses at once.

Oracle: threading.Events that the test controls; the event loop's own ticks.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from server.worker_pool import PoolBusy, WorkerPool, WorkTimedOut


def test_results_and_errors_come_back_while_the_loop_keeps_turning():
    async def main() -> int:
        pool = WorkerPool(threads=1, max_waiting=4)
        release = threading.Event()
        threading.Timer(0.3, release.set).start()
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while not release.is_set():
                ticks += 1
                await asyncio.sleep(0.005)

        ticker = asyncio.create_task(tick())
        assert await pool.run(lambda: release.wait(5) and 42, timeout=10) == 42
        await ticker
        with pytest.raises(KeyError):
            await pool.run(lambda: {}["missing"], timeout=10)
        return ticks

    assert asyncio.run(main()) > 10  # the loop turned while the work ran


def test_a_deadline_ends_the_wait_and_a_queued_job_is_skipped():
    async def main() -> None:
        pool = WorkerPool(threads=1, max_waiting=4)
        release = threading.Event()
        ran_second = threading.Event()
        first = asyncio.create_task(pool.run(lambda: release.wait(5), timeout=0.2))
        await asyncio.sleep(0.05)  # the first has started on the only thread
        with pytest.raises(WorkTimedOut) as second:
            await pool.run(ran_second.set, timeout=0.1)
        assert second.value.started is False
        with pytest.raises(WorkTimedOut) as late:
            await first
        assert late.value.started is True
        release.set()
        while pool.outstanding:
            await asyncio.sleep(0.01)
        assert not ran_second.is_set()  # abandoned before it started: never run

    asyncio.run(main())


def test_a_full_pool_refuses_at_once():
    async def main() -> None:
        pool = WorkerPool(threads=1, max_waiting=1)
        release = threading.Event()
        running = asyncio.create_task(pool.run(lambda: release.wait(5), timeout=5))
        waiting = asyncio.create_task(pool.run(lambda: 1, timeout=5))
        await asyncio.sleep(0.05)
        with pytest.raises(PoolBusy):
            await pool.run(lambda: 2, timeout=5)
        release.set()
        assert await running is True and await waiting == 1
        assert await pool.run(lambda: 3, timeout=5) == 3  # room again

    asyncio.run(main())
