"""`AsyncEngine.call(fn)`: `fn(engine)` runs on the engine's loop thread, between two steps (never
while one runs: a prefill server exports K/V from the pool there), while requests stream; its
result or exception comes back to the caller; once the loop has stopped it is refused with
EngineUnavailable instead of hanging. Checked on the deterministic fake engine.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from engine.async_engine import AsyncEngine
from engine.errors import EngineUnavailable
from engine.requests.sampling_params import SamplingParams
from tests.server.fake_engine import FakeEngine

LONG = SamplingParams(max_tokens=40, temperature=0.0)


class SteppingFake(FakeEngine):
    """Records whether a step is running, and on which thread steps run."""

    def __init__(self) -> None:
        super().__init__(step_delay=0.005)
        self.in_step = False
        self.step_threads: set[int] = set()

    def step(self):
        self.in_step = True
        self.step_threads.add(threading.get_ident())
        try:
            return super().step()
        finally:
            self.in_step = False


def test_calls_run_between_steps_on_the_loop_thread_and_report_back() -> None:
    async def main() -> None:
        fake = SteppingFake()
        engine = AsyncEngine(fake, max_pending=8)
        engine.start()
        stream = engine.generate("r", [1, 2], LONG)
        reading = asyncio.create_task(asyncio.wait_for(_drain(stream), 20))
        seen = []
        for _ in range(5):  # while the request steps
            seen.append(await engine.call(lambda core: (threading.get_ident(), core.in_step)))
            await asyncio.sleep(0.01)
        with pytest.raises(ZeroDivisionError):
            await engine.call(lambda core: 1 / 0)
        await reading
        assert {ident for ident, _ in seen} == fake.step_threads  # the loop thread's
        assert not any(in_step for _, in_step in seen)
        await engine.shutdown(1.0)
        with pytest.raises(EngineUnavailable):
            await asyncio.wait_for(engine.call(lambda core: None), 5)

    asyncio.run(main())


async def _drain(stream) -> None:
    async for _ in stream:
        pass
