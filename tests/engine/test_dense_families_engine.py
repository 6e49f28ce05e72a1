"""Gemma 2, Gemma 3 and Phi-3 through the engine, transformers' greedy continuation as the
oracle: batched with chunked prefill and alone, after a prefix-cache hit, and when requests
are preempted and recomputed (Phi-3 on both CPU paths: its own C++ step and PyTorch ops;
Gemma 3 with the C++ attention, each layer with its own window; Gemma 2 on PyTorch ops)."""

from __future__ import annotations

import pytest

from engine.requests.sampling_params import SamplingParams
from tests.devices import skip_cpu_kernels_off_cpu
from tests.engine.engine_fixtures import assert_no_leaks, random_prompts, run_staggered, tiny_engine
from tests.family_checkpoints import hf_greedy, make_family_model, save_family_checkpoint

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def family_engine(folder, arch: str, **config):
    if not (folder / "config.json").exists():
        save_family_checkpoint(arch, folder)
    return tiny_engine(folder, **config)


@pytest.mark.parametrize(
    "arch,kernel",
    [("gemma2", True), ("gemma3", True), ("phi3", False), ("phi3-longrope", True)],
)
def test_greedy_equals_transformers_batched_alone_cached_and_preempted(
    arch: str, kernel: bool, tmp_path
) -> None:
    skip_cpu_kernels_off_cpu(kernel)
    hf = make_family_model(arch)
    engine = family_engine(tmp_path, arch, max_num_batched_tokens=16, cpu_kernels=kernel)
    # the C++ step serves Phi-3; Gemma runs PyTorch layers with the C++ attention (Gemma 3) or
    # the PyTorch one (Gemma 2's capped scores)
    assert engine.describe().cpu_kernels == (kernel and arch != "gemma2")
    prompts = random_prompts(4, (3, 14), seed=1)  # 4 prompts > 16 tokens: chunked prefill
    outs = engine.generate(prompts, GREEDY)
    for prompt, out in zip(prompts, outs, strict=True):
        assert list(out.outputs[0].token_ids) == hf_greedy(hf, prompt, 8)
    alone = engine.generate([prompts[1]], GREEDY)[0]
    assert alone.outputs[0].token_ids == outs[1].outputs[0].token_ids

    # a prefix-cache hit: 3 full blocks of the first request's prompt reused
    prefix = random_prompts(1, (12, 12), seed=4)[0]
    engine.generate([prefix + [7]], GREEDY)
    hits = engine.stats().prefix_cache_hits
    second = engine.generate([prefix + [9, 10]], GREEDY)[0]
    assert engine.stats().prefix_cache_hits - hits >= 12
    assert list(second.outputs[0].token_ids) == hf_greedy(hf, prefix + [9, 10], 8)
    assert_no_leaks(engine)

    # 6 requests of up to 22 tokens (6 blocks each) in a cache of 14 blocks: some wait, some
    # are preempted and recomputed
    config = engine.runner.config
    block_bytes = config.num_layers * 2 * 4 * config.num_kv_heads * config.head_dim * 4
    small = family_engine(
        tmp_path, arch, kv_cache_memory_bytes=14 * block_bytes, cpu_kernels=kernel
    )
    prompts = random_prompts(6, (10, 14), seed=3)
    finals = run_staggered(small, prompts, [GREEDY] * 6, arrive_every=0)
    assert small.stats().num_preemptions >= 1
    for i, prompt in enumerate(prompts):
        assert list(finals[i].outputs[0].token_ids) == hf_greedy(hf, prompt, 8), f"request {i}"
    assert_no_leaks(small)
