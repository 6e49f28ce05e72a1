"""Helpers of the AsyncEngine tests (test_async_engine.py, test_async_engine_failures.py): run
a coroutine under a deadline, start an AsyncEngine over a fake engine, collect a stream, add
its deltas up, wait for a condition."""

from __future__ import annotations

import asyncio
import time

from engine.async_engine import AsyncEngine
from engine.requests.outputs import OutputAccumulator, RequestOutput
from engine.requests.sampling_params import SamplingParams
from tests.server.fake_engine import FakeEngine

GREEDY = SamplingParams(max_tokens=12, temperature=0.0)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=20))


async def started(fake: FakeEngine, **kwargs) -> AsyncEngine:
    engine = AsyncEngine(fake, max_pending=kwargs.pop("max_pending", 32), **kwargs)
    engine.start()
    return engine


async def collect(stream) -> list:
    return [out async for out in stream]


def whole(outs: list) -> RequestOutput:
    """The whole output a stream of deltas adds up to."""
    acc = OutputAccumulator()
    for out in outs:
        acc.add(out)
    return acc.result()


async def wait_for(predicate, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)
