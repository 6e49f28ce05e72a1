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

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize("arch", MOE_ARCHITECTURES)
def test_greedy_equals_transformers_generate(arch: str, tmp_path) -> None:
    engine = tiny_engine(tmp_path, arch, max_num_batched_tokens=32)
    if selected_device().type == "cpu" and cpu_kernels.extension() is not None:
        assert "C++ expert kernels" in engine.describe().forward_path  # models/moe/cpu_experts
    hf = make_hf_model(arch)
    prompts = random_prompts(3, (3, 30), seed=1)
    for prompt, out in zip(prompts, engine.generate(prompts, GREEDY), strict=True):
        with torch.no_grad():
            ref = hf.generate(
                torch.tensor([prompt]), max_new_tokens=12, min_new_tokens=12, do_sample=False,
                pad_token_id=0,
            )[0, len(prompt) :].tolist()  # fmt: skip
        assert list(out.outputs[0].token_ids) == ref
    assert_no_leaks(engine)


def test_batched_preempted_and_prefix_cached_equal_alone(tmp_path) -> None:
    """Staggered arrivals in a cache too small for all (preemptions), then a prompt sharing a
    cached prefix: every request's tokens equal its run alone in a roomy engine."""
    prompts = random_prompts(6, (10, 30), seed=3)
    short = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    params = [short] * len(prompts)
    # qwen3_moe: 2 layers, K and V, 2 KV heads of 24, fp32, block 4 -> 3,072 bytes per block
    small = tiny_engine(tmp_path, "qwen3_moe", kv_cache_memory_bytes=20 * 3072)
    batched = run_staggered(small, prompts, params, arrive_every=1)
    assert small.stats().num_preemptions >= 1
    big = tiny_engine(tmp_path, "qwen3_moe", enable_prefix_caching=False)
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
