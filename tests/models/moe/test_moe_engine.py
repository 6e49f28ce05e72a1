"""Mixture-of-experts models through the engine (on a CPU: the C++ paged attention and expert
kernels, models/moe/cpu_experts.py): greedy equals transformers' generate;
a request's tokens do not depend on its batch, on preemption or on a prefix-cache hit."""

from __future__ import annotations

import pytest
import torch

from engine.requests.sampling_params import SamplingParams
from models import cpu_kernels
from tests.checkpoints import MOE_ARCHITECTURES, make_hf_model
from tests.devices import selected_device
from tests.engine.engine_fixtures import (
    assert_no_leaks,
    random_prompts,
    run_staggered,
    tiny_engine,
)


@pytest.mark.parametrize("arch", MOE_ARCHITECTURES)
def test_greedy_equals_transformers_generate(arch: str, tmp_path) -> None:
    engine = tiny_engine(tmp_path, arch, max_num_batched_tokens=32)
    if selected_device().type == "cpu" and cpu_kernels.extension() is not None:
        # the whole step in C++, its sparse blocks too (models/cpu_kernels/moe_block.h)
        assert "C++ CPU kernels" in engine.describe().forward_path
    assert_greedy_equals_generate(engine, make_hf_model(arch), random_prompts(3, (3, 30), seed=1))


def assert_greedy_equals_generate(engine, hf, prompts: list[list[int]], n: int = 12) -> None:
    """Each prompt's n greedy tokens from the engine (batched) equal transformers' generate."""
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    for prompt, out in zip(prompts, engine.generate(prompts, params), strict=True):
        with torch.no_grad():
            ref = hf.generate(
                torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                pad_token_id=0,
            )[0, len(prompt) :].tolist()  # fmt: skip
        assert list(out.outputs[0].token_ids) == ref
    assert_no_leaks(engine)


def test_batched_preempted_and_prefix_cached_equal_alone(tmp_path) -> None:
    """Staggered arrivals in a cache too small for all (preemptions), then a prompt sharing a
    cached prefix: every request's tokens equal its run alone in a roomy engine."""
    prompts = random_prompts(6, (10, 30), seed=3)
    # qwen3_moe: 2 layers, K and V, 2 KV heads of 24, fp32, block 4 -> 3,072 bytes per block
    small = tiny_engine(tmp_path, "qwen3_moe", kv_cache_memory_bytes=20 * 3072)
    big = tiny_engine(tmp_path, "qwen3_moe", enable_prefix_caching=False)
    assert_preempted_and_cached_equal_alone(small, big, prompts)


def assert_preempted_and_cached_equal_alone(small, big, prompts: list[list[int]]) -> None:
    """`small` (a cache too small for all, prefix caching on) runs the prompts staggered, with
    preemptions, then the first prompt again and once more with 3 tokens more (a prefix-cache
    hit): every request's 8 greedy tokens equal its run alone in `big` (no prefix caching)."""
    short = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    batched = run_staggered(small, prompts, [short] * len(prompts), arrive_every=1)
    assert small.stats().num_preemptions >= 1
    for i, prompt in enumerate(prompts):
        alone = big.generate([prompt], short)[0]
        assert batched[i].outputs[0].token_ids == alone.outputs[0].token_ids, f"request {i}"
    small.generate([prompts[0]], short)  # its prompt's blocks cached again
    hits_before = small.stats().prefix_cache_hits
    shared = small.generate([prompts[0] + [7, 8, 9]], short)[0]
    assert small.stats().prefix_cache_hits - hits_before >= 8
    cold = big.generate([prompts[0] + [7, 8, 9]], short)[0]
    assert shared.outputs[0].token_ids == cold.outputs[0].token_ids
    assert_no_leaks(small)
