"""AsyncEngine guarantees, checked against a deterministic fake engine (tests/server/fake_engine.py):
texts, threads, slow readers, aborts, admission, deadlines, bursts, the GIL switch interval.
Failures (a stalled loop, failing steps, a dead loop, shutdown): test_async_engine_failures.py.

The oracle for texts is `expected_greedy_text`, a direct formula independent of the stepping
machinery; everything else is observable behaviour (threads, counts, finish reasons, timings).
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from engine.errors import EngineUnavailable, Overloaded
from engine.requests.sampling_params import SamplingParams
from tests.engine.async_helpers import GREEDY, collect, run, started, wait_for, whole
from tests.server.fake_engine import FakeEngine, expected_greedy_text


def test_concurrent_greedy_requests_match_the_oracle_and_end_after_the_finished_output():
    async def main():
        engine = await started(FakeEngine())
        prompts = [[65, 66], [70, 71, 72], [100]]
        streams = [engine.generate(f"r{i}", p, GREEDY) for i, p in enumerate(prompts)]
        results = await asyncio.gather(*(collect(s) for s in streams))
        for prompt, outs in zip(prompts, results, strict=True):
            assert outs[-1].finished and all(not o.finished for o in outs[:-1])
            assert whole(outs).outputs[0].text == expected_greedy_text(prompt, 12)
            assert outs[-1].outputs[0].finish_reason == "length"
        assert engine.num_pending() == 0
        await engine.shutdown(1.0)

    run(main())


def test_model_step_never_runs_on_the_event_loop_thread():
    fake = FakeEngine()
    step_threads: set[int] = set()
    original = fake.step

    def recording_step():
        step_threads.add(threading.get_ident())
        return original()

    fake.step = recording_step

    async def main():
        engine = await started(fake)
        await collect(engine.generate("a", [1, 2], GREEDY))
        await engine.shutdown(1.0)

    run(main())
    assert step_threads and threading.get_ident() not in step_threads
    assert len(step_threads) == 1


def test_slow_reader_gets_merged_snapshots_not_a_queue():
    async def main():
        engine = await started(FakeEngine(step_delay=0.001))
        stream = engine.generate("slow", [5], SamplingParams(max_tokens=60, temperature=0.0))
        seen = []
        async for out in stream:
            seen.append(out)
            await asyncio.sleep(0.03)  # far slower than the engine
        deltas = [o.outputs[0] for o in seen]
        assert "".join(d.text for d in deltas) == expected_greedy_text([5], 60)
        for before, after in zip(deltas, deltas[1:], strict=False):  # merged deltas stay contiguous
            assert after.text_offset == before.text_end and after.token_offset == before.num_tokens
        assert len(seen) < 30  # 60 token steps were merged into a few snapshots
        await engine.shutdown(1.0)

    run(main())


def test_closing_a_stream_early_aborts_the_request_and_frees_its_blocks():
    async def main():
        fake = FakeEngine(step_delay=0.005)
        engine = await started(fake)
        stream = engine.generate("x", [1, 2, 3], SamplingParams(max_tokens=100, temperature=0.0))
        await stream.__anext__()
        await stream.aclose()
        await wait_for(lambda: engine.num_pending() == 0)
        await wait_for(
            lambda: engine.stats().num_running == 0 and engine.stats().kv_blocks_used == 0
        )
        await engine.shutdown(1.0)

    run(main())


def test_cancelling_the_consumer_task_aborts_the_request():
    async def main():
        fake = FakeEngine(step_delay=0.005)
        engine = await started(fake)
        stream = engine.generate("c", [9], SamplingParams(max_tokens=100, temperature=0.0))
        task = asyncio.create_task(collect(stream))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_for(lambda: engine.num_pending() == 0 and not fake.has_unfinished_requests())
        await engine.shutdown(1.0)

    run(main())


def test_admission_bound_raises_overloaded_and_recovers():
    async def main():
        engine = await started(FakeEngine(step_delay=0.01), max_pending=2, retry_after=3.0)
        long = SamplingParams(max_tokens=20, temperature=0.0)
        a = engine.generate("a", [1], long)
        b = engine.generate("b", [2], long)
        with pytest.raises(Overloaded) as info:
            engine.generate("c", [3], long)
        assert info.value.retry_after == 3.0
        await collect(a)
        await collect(b)
        assert (await collect(engine.generate("d", [4], GREEDY)))[-1].finished
        await engine.shutdown(1.0)

    run(main())


def test_refusal_answers_what_generate_would_without_reserving_room():
    async def main():
        engine = await started(FakeEngine(step_delay=0.01), max_pending=2)
        long = SamplingParams(max_tokens=20, temperature=0.0)
        a = engine.generate("a", [1], long)
        assert engine.refusal() is None and engine.refusal() is None  # asking takes no room
        b = engine.generate("b", [2], long)  # so the second still fits
        assert isinstance(engine.refusal(), Overloaded)
        with pytest.raises(Overloaded):
            engine.generate("c", [3], long)
        await collect(a)
        await collect(b)
        await wait_for(lambda: engine.refusal() is None)  # room again once they finished
        await engine.shutdown(1.0)
        assert isinstance(engine.refusal(), EngineUnavailable)

    run(main())


def test_invalid_request_is_refused_synchronously_without_being_counted():
    async def main():
        engine = await started(FakeEngine(max_model_len=16))
        with pytest.raises(ValueError, match="context length"):
            engine.generate("big", list(range(10)), SamplingParams(max_tokens=10))
        assert engine.num_pending() == 0
        await engine.shutdown(1.0)

    run(main())


def test_engine_refusal_at_add_time_surfaces_from_admitted():
    async def main():
        fake = FakeEngine(max_num_seqs=1, max_queued_requests=1, step_delay=0.01)
        engine = await started(fake, max_pending=10)
        long = SamplingParams(max_tokens=50, temperature=0.0)
        first = engine.generate("1", [1], long)
        await first.admitted()
        await first.__anext__()  # running now
        second = engine.generate("2", [2], long)
        await second.admitted()  # waiting
        third = engine.generate("3", [3], long)
        with pytest.raises(Overloaded, match="in flight"):
            await third.admitted()
        await first.aclose()
        await second.aclose()
        await wait_for(lambda: engine.num_pending() == 0)
        await engine.shutdown(1.0)

    run(main())


def test_deadline_aborts_a_request_that_is_still_queued():
    async def main():
        fake = FakeEngine(max_num_seqs=1, step_delay=0.01)
        engine = await started(fake)
        blocker = engine.generate("block", [1], SamplingParams(max_tokens=40, temperature=0.0))
        await blocker.__anext__()
        queued = engine.generate("q", [2], GREEDY, deadline=time.monotonic() + 0.05)
        outs = await collect(queued)
        assert outs[-1].outputs[0].finish_reason == "abort"
        assert whole(outs).outputs[0].token_ids == ()  # it never ran
        assert (await collect(blocker))[-1].outputs[0].finish_reason == "length"
        await engine.shutdown(1.0)

    run(main())


def test_a_burst_read_in_one_pass_is_decided_before_the_loop_thread_steps():
    """Requests the event loop handles in one pass (a burst read together) are all admitted or
    refused before the idle loop thread is woken: no engine step competes with the refusals
    for the GIL or the cores. The thread then takes every admitted request in its first step."""
    fake = FakeEngine(max_num_seqs=4, max_queued_requests=4)
    adds_at_first_step: list[int] = []
    original_step = fake.step

    def recording_step():
        if not adds_at_first_step:
            adds_at_first_step.append(len(fake._waiting) + len(fake._running))
        return original_step()

    fake.step = recording_step

    async def main():
        engine = await started(fake, max_pending=8)
        streams, refused = [], 0
        for i in range(40):  # one pass of the event loop: no await in between
            try:
                streams.append(engine.generate(f"r{i}", [65 + i % 20], GREEDY))
            except Overloaded:
                refused += 1
            assert not adds_at_first_step, "a step started while the burst was being decided"
        time.sleep(0.2)  # the loop thread had time to step, had it been woken
        assert not adds_at_first_step and refused == 32
        results = await asyncio.gather(*(collect(s) for s in streams))
        assert adds_at_first_step == [8]  # all eight admitted ones in the first step
        assert all(outs[-1].finished for outs in results)
        await engine.shutdown(1.0)

    run(main())


def test_starting_lowers_the_gil_switch_interval_and_never_raises_it():
    """The event loop waits for the GIL at most GIL_SWITCH_INTERVAL_S while the loop thread
    runs Python; a process that already switches faster keeps its own interval."""
    import sys

    from engine.async_engine import GIL_SWITCH_INTERVAL_S

    before = sys.getswitchinterval()
    try:
        for given, expected in ((0.005, GIL_SWITCH_INTERVAL_S), (0.0002, 0.0002)):
            sys.setswitchinterval(given)

            async def main():
                engine = await started(FakeEngine())
                await engine.shutdown(1.0)

            run(main())
            assert sys.getswitchinterval() == pytest.approx(expected, abs=2e-6)
    finally:
        sys.setswitchinterval(before)
