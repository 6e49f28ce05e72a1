"""The overlapped loop's second part (issue 38, engine/step_pipeline.py): step k+1 is scheduled
and submitted before step k's sampled ids reach the host; its inputs take them below the runner
(engine/carried_inputs.py) and a row whose sequence ended on step k's token is discarded.

Same answers (token ids, logprobs, finish and stop reasons, text) and usage as the synchronous
loop, and as each request's solo run, for requests ending at a stop token, at max_tokens, at a
stop string and on their own budget, batched with requests that make the loop wait (penalties,
min_tokens, n > 1); the oracle is the synchronous loop, whose stop token and stop string are
read from its own greedy answer, so each one fires. Overlap, observed functionally on the fake
device: every step but the first is submitted while the step before is still on the device
(each device call waits, bounded, for the next submission), never in the synchronous loop.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from engine import fake_device_engine
from engine.carried_inputs import CarriedTokens
from engine.config import EngineConfig
from engine.engine import Engine
from engine.requests.request import PLACEHOLDER, TokenSequence
from engine.requests.sampling_params import SamplingParams
from engine.sampling.step_io import StepOutput
from engine.scheduling.step_plan import ScheduledChunk
from tests.engine.engine_fixtures import assert_no_leaks, run_staggered

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


def _engine(folder, overlapped: bool) -> Engine:
    config = EngineConfig(
        dtype="float32",
        kv_cache_memory_bytes=4_000_000,
        block_size=4,
        max_num_seqs=16,
        async_scheduling=overlapped,
    )
    return Engine.from_model(str(folder), config)


def _answers(finals) -> list:
    return [
        [(c.token_ids, c.logprobs, c.finish_reason, c.stop_reason, c.text) for c in f.outputs]
        for _, f in sorted(finals.items())
    ]


def _run(folder, overlapped: bool, prompts, params) -> tuple[list, tuple[int, int], int]:
    engine = _engine(folder, overlapped)
    answers = _answers(run_staggered(engine, prompts, params))
    usage = (engine.updater.prompt_tokens_total, engine.updater.generation_tokens_total)
    assert_no_leaks(engine)
    return answers, usage, engine.runner.carried_tokens.num_carried


def test_held_steps_give_the_synchronous_and_solo_answers(tiny_model_folder) -> None:
    tokenizer = _engine(tiny_model_folder, False).tokenizer
    prompts = [tokenizer.encode(f"Hello world {i}, how are you") for i in range(7)]
    # The oracle's own greedy answer names a stop token and a stop string that fire.
    (((ids, _, _, _, text),),), _, _ = _run(tiny_model_folder, False, prompts[:1], [GREEDY])
    stop_string = text[3:5]
    assert stop_string and stop_string in text[:8], text
    params = [
        replace(GREEDY, stop_token_ids=[ids[4]]),  # ends at a stop token
        replace(GREEDY, max_tokens=3),  # at max_tokens, before the others
        replace(GREEDY, stop=[stop_string]),  # at a stop string
        SamplingParams(max_tokens=9, temperature=0.9, seed=3, logprobs=2, ignore_eos=True),
        SamplingParams(max_tokens=6, temperature=0.0, repetition_penalty=1.3, ignore_eos=True),
        SamplingParams(max_tokens=7, temperature=0.0, min_tokens=4, ignore_eos=True),
        SamplingParams(max_tokens=5, temperature=1.0, n=2, seed=5, ignore_eos=True),
    ]
    prompts = [prompts[0]] * 3 + prompts[3:]  # the oracle's prompt for the three stops
    sync, sync_usage, sync_carried = _run(tiny_model_folder, False, prompts, params)
    held, held_usage, held_carried = _run(tiny_model_folder, True, prompts, params)
    assert sync_carried == 0 and held_carried > 0  # the held path ran
    assert [a[0][2:4] for a in sync[:3]] == [("stop", ids[4]), ("length", None)] + [
        ("stop", stop_string)
    ]
    assert held == sync
    assert held_usage == sync_usage
    for i in (0, 2, 3):  # a stop token, a stop string, a seeded request, alone
        solo, _, carried = _run(tiny_model_folder, True, [prompts[i]], [params[i]])
        assert carried > 0 and solo == [sync[i]]


def _submissions_in_flight(overlapped: bool, wait_s: float) -> tuple[int, int, list]:
    """(steps submitted while the one before was on the device, steps, answers)."""
    config = EngineConfig(block_size=16, max_num_seqs=8, async_scheduling=overlapped)
    engine = fake_device_engine(0.0, config, vocab_size=64)
    runner = engine.runner
    submitted = threading.Event()
    sample_step, submit = runner.step_sampler.sample_step, runner.submit

    def device_step(logits, all_rows, sampling):  # on the device thread
        submitted.wait(wait_s)  # the next step's submission, if it comes while this one runs
        submitted.clear()
        return sample_step(logits, all_rows, sampling)

    def submitting(*args):
        pending = submit(*args)
        if runner.num_steps > 1:
            submitted.set()
        return pending

    runner.step_sampler.sample_step = device_step
    runner.submit = submitting
    try:
        params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
        prompts = [list(range(1, 9 + i)) for i in range(4)]
        answers = _answers(run_staggered(engine, prompts, [params] * 4, arrive_every=0))
    finally:
        engine.close()
    return runner.submitted_in_flight, runner.num_steps, answers


def test_the_next_step_is_submitted_while_the_device_runs_the_previous_one() -> None:
    in_flight, steps, answers = _submissions_in_flight(True, wait_s=10.0)
    # The last step draws every request's last token: nothing to run on, it is waited for.
    assert (in_flight, steps) == (steps - 1, 5)
    control, sync_steps, sync_answers = _submissions_in_flight(False, wait_s=0.05)
    assert (control, sync_steps) == (0, 5)
    assert answers == sync_answers


def test_carried_inputs_take_the_previous_steps_draws() -> None:
    seq = TokenSequence(0, [3, 4, PLACEHOLDER], 2, num_computed_tokens=2)
    chunks = [ScheduledChunk(None, seq, 2, 1, True)]
    carried = CarriedTokens()
    with pytest.raises(RuntimeError, match="failed"):  # no previous step output
        carried.resolve(chunks, [(0, 1)])
    carried.keep(StepOutput(tokens=(7, 9)))
    assert carried.resolve(chunks, [(0, 1)])[0].input_ids == [9]
    assert seq.token_ids == [3, 4, PLACEHOLDER]  # the sequence itself is the engine's
    assert carried.resolve(chunks, [])[0].input_ids == [PLACEHOLDER]
