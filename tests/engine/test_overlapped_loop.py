"""The overlapped step loop (`EngineConfig.async_scheduling`, issue 38): a step's outputs are
built while the next step runs on the device and handed out one step later.

Same tokens: greedy, seeded, n > 1, plain and sampled beam search, logprobs, stop strings,
structured-output, speculated and encoder-decoder requests, batched, give the synchronous
loop's answers (token ids, logprobs, finish reasons, text), and a greedy and a seeded one their
solo runs. Overlap, observed functionally on the fake device (engine/fake_device.py): each
step's device call waits (bounded) for the host to emit the previous step's outputs, and the
host records that the call was still in flight (its result not yet there) when it emitted; the
synchronous loop, the control, never emits while a call is in flight.
"""

from __future__ import annotations

import dataclasses
import threading

from engine import fake_device_engine
from engine.config import EngineConfig
from engine.engine import Engine
from engine.requests.sampling_params import SamplingParams
from engine.requests.structured_output import StructuredOutput
from engine.speculative.config import SpeculativeConfig
from tests.encdec_checkpoints import save_encdec_checkpoint
from tests.engine.engine_fixtures import assert_no_leaks, run_staggered

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=8, temperature=0.9, seed=3, logprobs=2, ignore_eos=True)
REQUESTS = [
    GREEDY,
    SEEDED,
    SamplingParams(max_tokens=6, temperature=1.0, n=2, best_of=3, seed=5),
    SamplingParams(max_tokens=6, temperature=0.0, use_beam_search=True, n=2, best_of=3),
    SamplingParams(max_tokens=6, temperature=0.8, use_beam_search=True, n=2, seed=7, logprobs=1),
    SamplingParams(max_tokens=12, temperature=0.0, stop=["e"], prompt_logprobs=1),
    SamplingParams(
        max_tokens=30,
        temperature=0.7,
        seed=8,
        structured_output=StructuredOutput.from_schema(SCHEMA),
    ),
]


def _engine(folder, async_scheduling: bool, **config) -> Engine:
    defaults = dict(dtype="float32", kv_cache_memory_bytes=4_000_000, block_size=4, max_num_seqs=16)
    config = EngineConfig(**{**defaults, **config}, async_scheduling=async_scheduling)
    return Engine.from_model(str(folder), config)


def _answers(finals) -> list:
    return [
        [(c.token_ids, c.logprobs, c.finish_reason, c.text) for c in finals[i].outputs]
        for i in sorted(finals)
    ]


def test_the_overlapped_loop_gives_the_synchronous_loops_tokens(tiny_model_folder) -> None:
    prompts = [f"Hello world {i}, how are you" for i in range(len(REQUESTS))]
    runs = {}
    for overlapped in (False, True):
        engine = _engine(tiny_model_folder, overlapped)
        ids = [engine.tokenizer.encode(p) for p in prompts]
        runs[overlapped] = _answers(run_staggered(engine, ids, REQUESTS))
        assert_no_leaks(engine)
    assert all(c[2] != "error" for answer in runs[True] for c in answer)
    assert runs[True] == runs[False]
    for i in (0, 1):  # the greedy and the seeded request alone
        engine = _engine(tiny_model_folder, True)
        solo = _answers(run_staggered(engine, [ids[i]], [REQUESTS[i]]))
        assert solo == [runs[True][i]]


def test_speculated_requests_give_the_synchronous_loops_tokens(tiny_model_folder) -> None:
    motif = [5, 9, 14] * 4
    prompts = [motif[: 7 + i] for i in range(3)]
    params = [GREEDY, SEEDED, dataclasses.replace(GREEDY, max_tokens=12)]
    runs = {}
    for overlapped in (False, True):
        spec = SpeculativeConfig(num_tokens=3)
        engine = _engine(tiny_model_folder, overlapped, speculative=spec)
        runs[overlapped] = _answers(run_staggered(engine, prompts, params, arrive_every=0))
        assert engine.stats().speculation.num_proposed_tokens > 0
    assert runs[True] == runs[False]


def test_encoder_decoder_requests_give_the_synchronous_loops_tokens(tmp_path) -> None:
    folder = save_encdec_checkpoint("t5v11", tmp_path / "t5")
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16]]
    params = [GREEDY, SEEDED, REQUESTS[3]]
    runs = {}
    for overlapped in (False, True):
        engine = _engine(folder, overlapped)
        runs[overlapped] = _answers(run_staggered(engine, prompts, params))
    assert runs[True] == runs[False]


def _emissions_in_flight(async_scheduling: bool, wait_s: float) -> list[bool]:
    """Per host emission of outputs, whether a submitted device call was still in flight."""
    config = EngineConfig(block_size=16, max_num_seqs=8, async_scheduling=async_scheduling)
    engine = fake_device_engine(0.0, config, vocab_size=64)
    runner = engine.runner
    emitted = threading.Event()
    in_flight: list = []  # the futures of the submitted device calls
    seen: list[bool] = []
    sample_step, submit, emit = runner.step_sampler.sample_step, runner.submit, engine._emit

    calls = []

    def device_step(logits, all_rows, sampling):  # on the device thread
        if calls:  # the first step has no earlier outputs to emit
            emitted.wait(wait_s)  # the host's emission, if it comes while this call runs
        calls.append(1)
        emitted.clear()
        return sample_step(logits, all_rows, sampling)

    def submitting(*args):
        pending = submit(*args)
        in_flight.append(pending.done)
        return pending

    def emitting(moved):
        if moved:
            seen.append(any(not future.done() for future in in_flight))
            emitted.set()
        return emit(moved)

    runner.step_sampler.sample_step = device_step
    runner.submit = submitting
    engine._emit = emitting
    try:
        params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
        for i in range(4):
            engine.add_request(str(i), list(range(1, 9)), params)
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        engine.close()
    return seen


def test_the_host_emits_the_previous_steps_outputs_while_the_device_runs() -> None:
    overlapped = _emissions_in_flight(True, wait_s=10.0)
    # One emission per step that moved (5 tokens each); the last flushes the last step's
    # outputs, with no step left to overlap it.
    assert overlapped == [True] * 4 + [False]
    assert _emissions_in_flight(False, wait_s=0.05) == [False] * 5  # the control
