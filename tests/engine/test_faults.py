"""Fault injection (engine/faults.py) in the real Engine, and what AsyncEngine makes of a kill
(the spec itself: tests/engine/requests/test_fault_spec.py).

The oracle for a faulted request's neighbours is their own solo run: a fault ends only the
request that carries it, so a batch-mate's tokens are those it gets alone (greedy, batch
invariant). A kill raises `FatalEngineError` out of `step()`; AsyncEngine stops at once.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from engine import FatalEngineError, FaultSpec, SamplingParams
from engine.async_engine import AsyncEngine
from engine.errors import EngineUnavailable
from tests.engine.engine_fixtures import assert_no_leaks, random_prompts, run_staggered, tiny_engine
from tests.server.fake_engine import FakeEngine

PLAIN = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny-llama-faults")


def test_a_failed_request_ends_with_error_after_k_tokens_and_its_batch_mate_is_untouched(folder):
    prompts = random_prompts(2, (5, 9), seed=3)
    solo = run_staggered(tiny_engine(folder), prompts, [PLAIN, PLAIN], arrive_every=1000)
    engine = tiny_engine(folder)
    faulted = dataclasses.replace(PLAIN, fault=FaultSpec(fail_after_tokens=3))
    finals = run_staggered(engine, prompts, [faulted, PLAIN], arrive_every=0)
    failed, other = finals[0], finals[1]
    assert failed.finished and failed.outputs[0].finish_reason == "error"
    assert failed.error == "injected fault: the request failed after 3 generated token(s)"
    assert failed.outputs[0].token_ids == solo[0].outputs[0].token_ids[:3]
    assert other.error is None and other.outputs[0].finish_reason == "length"
    assert other.outputs[0].token_ids == solo[1].outputs[0].token_ids
    assert_no_leaks(engine)


def test_a_fault_past_max_tokens_never_fires(folder):
    engine = tiny_engine(folder)
    params = dataclasses.replace(PLAIN, max_tokens=4, fault=FaultSpec(fail_after_tokens=4))
    [final] = engine.generate([random_prompts(1, (4, 4))[0]], params)
    assert final.outputs[0].finish_reason == "length" and final.error is None


def test_a_kill_raises_fatal_engine_error_from_step_once_k_tokens_exist(folder):
    engine = tiny_engine(folder)
    killer = dataclasses.replace(PLAIN, fault=FaultSpec(kill_engine_after_tokens=2))
    engine.add_request("killer", random_prompts(1, (6, 6))[0], killer)
    engine.add_request("bystander", random_prompts(1, (6, 6), seed=1)[0], PLAIN)
    engine.step()  # prefill: the first token of each
    with pytest.raises(FatalEngineError, match="killer"):
        engine.step()


def test_async_engine_stops_at_once_on_a_fatal_error_and_reports_it():
    async def main() -> None:
        dead: list[str] = []
        engine = AsyncEngine(FakeEngine(step_delay=0.005), max_pending=8, on_dead=dead.append)
        engine.start()
        killer = SamplingParams(
            max_tokens=50, temperature=0.0, fault=FaultSpec(kill_engine_after_tokens=2)
        )
        bystander = engine.generate("bystander", [2], SamplingParams(max_tokens=100, temperature=0))
        outs = await asyncio.gather(
            collect(engine.generate("killer", [1], killer)), collect(bystander)
        )
        for stream_outs in outs:
            assert stream_outs[-1].outputs[0].finish_reason == "error"
            assert "FatalEngineError" in stream_outs[-1].error
        for _ in range(200):  # the loop reports its death just after failing the requests
            if dead:
                break
            await asyncio.sleep(0.01)
        assert dead and "killer" in dead[0]  # one failure was enough: no retries
        assert not engine.is_healthy()
        with pytest.raises(EngineUnavailable):
            engine.generate("late", [1], SamplingParams(max_tokens=2, temperature=0))
        await engine.shutdown(0.1)

    asyncio.run(asyncio.wait_for(main(), timeout=20))


async def collect(stream) -> list:
    return [out async for out in stream]


def test_a_fatal_error_from_the_runner_leaves_step_instead_of_failing_the_batch(folder):
    # A tensor- or pipeline-parallel step that failed leaves the ranks out of step
    # (engine/model_runner.py raises FatalEngineError): the engine must stop at once, not fail
    # the step's requests and go on to the next step's collectives.
    engine = tiny_engine(folder)
    engine.add_request("a", random_prompts(1, (6, 6))[0], PLAIN)

    def out_of_step(*args, **kwargs):
        raise FatalEngineError("a tensor-parallel step failed: the ranks are out of step")

    engine.runner.execute = out_of_step
    with pytest.raises(FatalEngineError, match="out of step"):
        engine.step()
