"""WorkerPool: work whose cost a request chooses (compiling its grammar), off the event loop,
with a deadline.

Contract: `WorkerPool(threads, max_waiting)`; `await pool.run(fn, timeout)` runs `fn()` on one
of `threads` daemon threads and returns its result or raises its exception. Past `timeout`
seconds it raises `WorkTimedOut` (`started`: whether `fn` had begun; one that had not is
skipped). More than `max_waiting` jobs not yet started: `PoolBusy` at once, queueing nothing.
A thread cannot be interrupted, so a job past its deadline runs on to its end (the grammar
engine's own limits bound it: engine/grammar/grammar_compiler.py) and its result is dropped.
The threads are daemons (not concurrent.futures': those are joined at exit, so a signal would
wait for a compilation) and start with the first job.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class PoolBusy(Exception):
    """Every worker is busy and `max_waiting` jobs already wait."""


class WorkTimedOut(Exception):
    def __init__(self, started: bool) -> None:
        super().__init__("the work did not finish before its deadline")
        self.started = started


@dataclass
class _Job:
    work: Callable[[], Any]
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future[Any]
    started: bool = False
    abandoned: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class WorkerPool:
    def __init__(self, threads: int = 2, max_waiting: int = 64) -> None:
        if threads < 1 or max_waiting < 0:
            raise ValueError(f"threads >= 1 and max_waiting >= 0, got {threads}, {max_waiting}")
        self.threads = threads
        self.max_waiting = max_waiting
        self._jobs: queue.Queue[_Job] = queue.Queue()
        self._started = 0
        self._outstanding = 0  # jobs queued or running (abandoned ones too: they hold a thread)
        self._lock = threading.Lock()

    @property
    def outstanding(self) -> int:
        """Jobs queued or running, abandoned ones included."""
        with self._lock:
            return self._outstanding

    async def run(self, work: Callable[[], Any], timeout: float) -> Any:
        loop = asyncio.get_running_loop()
        job = _Job(work, loop, loop.create_future())
        with self._lock:
            if self._outstanding >= self.threads + self.max_waiting:
                raise PoolBusy()
            self._outstanding += 1
            self._jobs.put(job)
            if self._started < self.threads:
                self._started += 1
                threading.Thread(target=self._serve, name="tgserve-worker", daemon=True).start()
        try:
            return await asyncio.wait_for(asyncio.shield(job.done), timeout)
        except TimeoutError:
            with job.lock:
                job.abandoned = True
                started = job.started
            raise WorkTimedOut(started) from None

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                self._run(job)
            finally:
                with self._lock:
                    self._outstanding -= 1

    @staticmethod
    def _run(job: _Job) -> None:
        with job.lock:
            if job.abandoned:
                return
            job.started = True
        try:
            result, error = job.work(), None
        except BaseException as exc:  # handed to the awaiting task, as to_thread does
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the event loop is closed: nobody waits
            job.loop.call_soon_threadsafe(settle, job.done, result, error)


def settle(done: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """Hands a thread's outcome to the future awaiting it (on its loop); nobody waits: a no-op."""
    if done.done():
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(result)
