"""AsyncEngine under failure, against a deterministic fake engine (tests/server/fake_engine.py):
the watchdog reports a stalled loop only while work is pending; a failing step ends the requests
in flight and the loop goes on; repeated failures stop it and refuse new work; when the loop
dies every request ends; shutdown drains short work and aborts what outlives its timeout.

The oracle for texts is `expected_greedy_text`, a direct formula independent of the stepping
machinery; everything else is observable behaviour (threads, counts, finish reasons, timings).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from engine.errors import EngineUnavailable
from engine.requests.sampling_params import SamplingParams
from tests.engine.async_helpers import GREEDY, collect, run, started, wait_for, whole
from tests.server.fake_engine import FakeEngine, expected_greedy_text


def test_watchdog_reports_a_stalled_loop_only_while_work_is_pending():
    async def main():
        fake = FakeEngine()
        engine = await started(fake, stall_timeout=0.2)
        await asyncio.sleep(0.3)
        assert engine.is_healthy()  # idle for longer than the timeout is fine
        fake.stall.set()
        stream = engine.generate("s", [1], GREEDY)
        await asyncio.sleep(0.4)
        assert not engine.is_healthy()
        fake.stall.clear()
        await collect(stream)
        assert engine.is_healthy()
        await engine.shutdown(1.0)

    run(main())


def test_a_failing_step_ends_in_flight_requests_with_error_and_the_loop_goes_on():
    async def main():
        fake = FakeEngine(step_delay=0.005)
        engine = await started(fake)
        stream = engine.generate("e", [1], SamplingParams(max_tokens=50, temperature=0.0))
        first = await stream.__anext__()
        fake.fail_steps = 1
        outs = await collect(stream)
        assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "error"
        assert outs[-1].error and "/secret" not in outs[-1].error
        # What was generated is kept: the deltas before the failure (the first one included,
        # however many steps ran before the failing one) fold to at least one token.
        assert len(whole([first, *outs]).outputs[0].token_ids) >= 1
        assert engine.is_healthy()
        after = await collect(engine.generate("ok", [4], GREEDY))
        assert whole(after).outputs[0].text == expected_greedy_text([4], 12)
        await engine.shutdown(1.0)

    run(main())


def test_repeated_step_failures_stop_the_loop_and_refuse_new_work():
    async def main():
        fake = FakeEngine()
        fake.fail_steps = 100
        engine = await started(fake)
        outs = await collect(engine.generate("f", [1], GREEDY))
        assert outs[-1].outputs[0].finish_reason == "error"
        await wait_for(lambda: not engine.is_healthy())
        with pytest.raises(EngineUnavailable):
            engine.generate("late", [1], GREEDY)
        await engine.shutdown(0.1)

    run(main())


def test_when_the_loop_dies_every_request_ends_and_none_hangs():
    async def main():
        fake = FakeEngine(step_delay=0.005)
        fake.fail_steps = 100
        engine = await started(fake)

        async def one(i: int) -> str:
            try:
                stream = engine.generate(f"r{i}", [i + 1], GREEDY)
                await stream.admitted()
                return (await collect(stream))[-1].outputs[0].finish_reason
            except EngineUnavailable:
                return "refused"

        outcomes = await asyncio.gather(*(one(i) for i in range(10)))
        assert set(outcomes) <= {"error", "refused"} and "error" in outcomes
        # The streams end when the failure is dispatched; the loop declares itself dead just
        # after, on its own thread.
        await wait_for(lambda: engine.num_pending() == 0 and not engine.is_healthy())
        await engine.shutdown(0.1)

    run(main())


def test_shutdown_drains_short_work_and_aborts_what_outlives_the_timeout():
    async def main():
        fake = FakeEngine(step_delay=0.01)
        engine = await started(fake)
        short = engine.generate("short", [1], SamplingParams(max_tokens=3, temperature=0.0))
        long = engine.generate("long", [2], SamplingParams(max_tokens=100, temperature=0.0))
        short_task = asyncio.create_task(collect(short))
        long_task = asyncio.create_task(collect(long))
        await asyncio.sleep(0.02)
        t0 = time.monotonic()
        await engine.shutdown(0.3)
        assert time.monotonic() - t0 < 2.0
        assert (await short_task)[-1].outputs[0].finish_reason == "length"
        assert (await long_task)[-1].outputs[0].finish_reason == "abort"
        with pytest.raises(EngineUnavailable):
            engine.generate("after", [1], GREEDY)

    run(main())
