"""Sampling, beam search and grammar masks with their logits on another device than the
defaults (issue 24, item 5): every tensor they build must be built on the logits' device.

tests/engine/device_placement.py puts the logits on `meta` (real values underneath) and
raises, as CUDA does, when an op meets a device tensor and a host tensor. The oracle of each
run is the same work on plain CPU tensors: tokens, logprobs and finish reasons must be equal,
and no step may fail. These run on CPU in CI; a `base`-on-the-host bug of the kind that broke
every beam step on CUDA (beam_search.py) fails them here.
"""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.grammar.token_mask import TokenMask
from engine.requests.sampling_params import SamplingParams
from engine.requests.structured_output import StructuredOutput
from engine.sampling.sampler import Sampler, seeded_generator
from engine.sampling.sampling_batch import SamplingRow
from tests.engine.device_placement import DevicePlacementMode, on_other_device
from tests.engine.engine_fixtures import run_staggered

VOCAB = 300


def test_the_mode_raises_where_cuda_would_and_computes_the_rest() -> None:
    logits = torch.randn(2, 5)
    with DevicePlacementMode() as mode:
        device_logits = on_other_device(logits)
        with pytest.raises(RuntimeError, match="same device"):
            device_logits + torch.zeros(5)  # a host row meets a device tensor
        scaled = device_logits * torch.tensor(2.0)  # a zero-dim host tensor may mix
        fresh = torch.ones(2, 1, device=device_logits.device)
        total = (scaled + fresh).tolist()
    assert total == (logits * 2.0 + 1.0).tolist()
    assert mode.ops_on_device >= 3


def _rows(seed_generators: bool) -> tuple[list[SamplingRow], TokenMask]:
    """One row per feature of the sampler, and a grammar mask over two of them."""
    history = list(range(3, 40, 3))
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.0, logprobs=3, logit_bias={7: 5.0, 11: -100.0}),
        SamplingParams(temperature=0.8, top_k=20, seed=1),
        SamplingParams(temperature=1.2, top_p=0.7, min_p=0.05, seed=2, logprobs=2),
        SamplingParams(temperature=1.0, repetition_penalty=1.3, presence_penalty=0.5),
        SamplingParams(temperature=0.0, frequency_penalty=0.7, min_tokens=9, stop_token_ids=(4,)),
        SamplingParams(temperature=0.9, top_k=5, top_p=0.9),  # under the grammar
        SamplingParams(temperature=0.0),  # under the grammar
    ]
    rows = [
        SamplingRow(
            p,
            prompt_token_ids=history,
            output_token_ids=history[::2],
            generator=seeded_generator(p.seed) if p.seed is not None and seed_generators else None,
        )
        for p in params
    ]
    allowed = torch.zeros(2, VOCAB, dtype=torch.bool)
    allowed[0, 100:140] = True
    allowed[1, ::7] = True
    return rows, TokenMask((6, 7), allowed)


def test_the_sampler_gives_the_host_answer_with_device_logits() -> None:
    logits = torch.randn(8, VOCAB, generator=torch.Generator().manual_seed(3)) * 4
    rows, grammar = _rows(seed_generators=True)
    want = Sampler(eos_token_ids=(2,), seed=5, device_side=True)(logits, rows, grammar)
    rows, grammar = _rows(seed_generators=True)
    sampler = Sampler(eos_token_ids=(2,), seed=5, device_side=True)
    with DevicePlacementMode() as mode:
        got = sampler(on_other_device(logits), rows, grammar)
    assert got == want
    assert mode.ops_on_device > 20  # the sampler's work did run on the device tensors


def _device_engine(engine: Engine, monkeypatch) -> list[int]:
    """Makes `engine`'s runner sample from logits on the other device (the runner floor's
    `StepSampler`, engine/sampling/step_sampler.py); returns the per-step op counts."""
    sampler = engine.runner.step_sampler
    host_step = sampler.sample_step
    counts: list[int] = []

    def sample_on_device(logits, all_rows, sampling):
        rows = {i: on_other_device(r) for i, r in all_rows.items()}
        # Outside the runner's inference mode, where `.to(device)` is the copy the mode follows.
        with torch.inference_mode(False), DevicePlacementMode() as mode:
            result = host_step(on_other_device(logits), rows, sampling)
        counts.append(mode.ops_on_device)
        return result

    monkeypatch.setattr(sampler, "sample_step", sample_on_device)
    return counts


def _answers(finals: dict) -> list:
    return [
        [(c.token_ids, c.finish_reason, c.cumulative_logprob, c.logprobs) for c in out.outputs]
        for _, out in sorted(finals.items())
    ]


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.fixture(scope="module")
def folder(tiny_model_folder):
    return tiny_model_folder


def _engine(folder) -> Engine:
    config = EngineConfig(
        dtype="float32",
        kv_cache_memory_bytes=4_000_000,
        block_size=4,
        max_num_seqs=16,
        seed=7,
        cpu_kernels=False,  # the forward is not under test: PyTorch ops, no C++ build
        device="cpu",  # the `meta` stand-in is the other device, on any test machine
    )
    return Engine.from_model(str(folder), config)


REQUESTS = [
    SamplingParams(max_tokens=6, temperature=0.0, use_beam_search=True, n=2, best_of=3),
    SamplingParams(max_tokens=6, temperature=0.9, use_beam_search=True, n=2, seed=4, logprobs=2),
    SamplingParams(max_tokens=6, temperature=1.0, n=2, best_of=3, seed=5, logprobs=1),
    SamplingParams(max_tokens=6, temperature=0.7, top_p=0.8, repetition_penalty=1.2, seed=6),
    SamplingParams(
        max_tokens=6, temperature=0.0, logit_bias={40: 3.0}, prompt_logprobs=2, stop=["e"]
    ),
    SamplingParams(
        max_tokens=30,
        temperature=0.0,
        use_beam_search=True,
        n=2,
        structured_output=StructuredOutput.from_schema(SCHEMA),
    ),
    SamplingParams(
        max_tokens=30, temperature=1.0, seed=8, structured_output=StructuredOutput("json_object")
    ),
]


def test_engine_features_give_the_host_answer_with_device_logits(folder, monkeypatch) -> None:
    """Beam search (plain and sampled, with a grammar), n / best_of, logprobs and prompt
    logprobs, penalties, logit_bias, seeds, stop strings and structured outputs, batched."""
    engine = _engine(folder)
    prompts = [engine.tokenizer.encode("Hello world, how are you")] * len(REQUESTS)
    want = _answers(run_staggered(engine, prompts, REQUESTS))
    engine = _engine(folder)
    counts = _device_engine(engine, monkeypatch)
    got = _answers(run_staggered(engine, prompts, REQUESTS))
    assert all(c[1] != "error" for answer in got for c in answer), got
    assert got == want
    assert counts and min(counts) > 0
