"""gpt-oss through the engine (on a CPU: PyTorch layers, its sinks through the key-block
attention and its experts through the batch-invariant PyTorch GEMM, models/gpt_oss): greedy
equals transformers' generate for prompts past the sliding window; a request's tokens do not
depend on its batch, on preemption or on a prefix-cache hit."""

from __future__ import annotations

from tests.engine.engine_fixtures import random_prompts, tiny_engine
from tests.models.gpt_oss.checkpoint import make_gpt_oss, save_gpt_oss
from tests.models.moe.test_moe_engine import (
    assert_greedy_equals_generate,
    assert_preempted_and_cached_equal_alone,
)


def test_greedy_equals_transformers_generate(tmp_path) -> None:
    engine = tiny_engine(save_gpt_oss(tmp_path), max_num_batched_tokens=32)
    assert engine.describe().forward_path == "PyTorch ops only"  # no kernel takes sinks
    prompts = random_prompts(3, (3, 30), seed=1)  # chunked, and past the window of 8
    assert_greedy_equals_generate(engine, make_gpt_oss(), prompts, 10)


def test_batched_preempted_and_prefix_cached_equal_alone(tmp_path) -> None:
    folder = save_gpt_oss(tmp_path)
    # 2 layers, K and V, 2 KV heads of 16, fp32, block 4 -> 2,048 bytes per block
    small = tiny_engine(folder, kv_cache_memory_bytes=12 * 2048)
    big = tiny_engine(folder, enable_prefix_caching=False)
    assert_preempted_and_cached_equal_alone(small, big, random_prompts(5, (10, 24), seed=3))
