"""EngineConfig validation and the pure helpers that size the KV cache (no torch)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from engine.config import (
    EngineConfig,
    dtype_bytes,
    resolve_device,
    resolve_dtype_name,
    resolve_max_model_len,
)
from engine.kv_sizing import kv_cache_budget_bytes, num_kv_blocks


def test_defaults_are_valid_and_documented_values():
    c = EngineConfig()
    assert (c.block_size, c.max_num_seqs, c.max_num_batched_tokens) == (16, 64, 2048)
    assert c.target_itl_ms == 100.0 and c.max_in_flight == 64 + 256
    assert c.enable_prefix_caching and c.max_model_len is None and c.kv_cache_memory_bytes is None
    assert 0.0 < c.kv_cache_memory_fraction <= 1.0


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        EngineConfig().block_size = 32  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("block_size", 0),
        ("block_size", 2048),
        ("block_size", True),
        ("block_size", 16.0),
        ("kv_cache_memory_bytes", 0),
        ("kv_cache_memory_bytes", -5),
        ("kv_cache_memory_fraction", 0.0),
        ("kv_cache_memory_fraction", 1.5),
        ("kv_cache_memory_fraction", "0.5"),
        ("max_num_seqs", 0),
        ("max_num_batched_tokens", 0),
        ("max_num_batched_tokens", 32),  # below max_num_seqs (64)
        ("max_model_len", 0),
        ("dtype", "fp8"),
        ("device", "tpu"),
        ("device", "cuda:x"),
        ("enable_prefix_caching", 1),
        ("max_queued_requests", 0),
        ("target_itl_ms", 0),
        ("target_itl_ms", True),
        ("target_itl_ms", "100"),
        ("seed", -1),
        ("enforce_eager", 1),
        ("batch_invariant", "yes"),
    ],
)
def test_invalid_fields_raise_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        EngineConfig(**{field: value})


def test_valid_non_default_values_are_accepted():
    c = EngineConfig(
        block_size=32,
        kv_cache_memory_bytes=1 << 20,
        max_num_seqs=8,
        max_num_batched_tokens=8,
        max_model_len=128,
        dtype="bfloat16",
        device="cuda:1",
        enable_prefix_caching=False,
        max_queued_requests=1,
        target_itl_ms=None,
        seed=7,
    )
    assert c.device == "cuda:1"


def test_auto_device_follows_cuda_availability_and_explicit_cuda_needs_it():
    assert resolve_device("auto", cuda_available=True) == "cuda"
    assert resolve_device("auto", cuda_available=False) == "cpu"
    assert resolve_device("cpu", cuda_available=True) == "cpu"
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device("cuda:0", cuda_available=False)


def test_auto_dense_dtype_is_bfloat16_where_native_else_float32_on_cpu_or_float16_on_cuda():
    assert resolve_dtype_name("auto", "cpu", bf16_supported=False) == "float32"
    assert resolve_dtype_name("auto", "cpu", bf16_supported=True) == "bfloat16"
    assert resolve_dtype_name("auto", "cuda") == "bfloat16"
    assert resolve_dtype_name("auto", "cuda:0", bf16_supported=False) == "float16"
    assert resolve_dtype_name("float16", "cpu") == "float16"
    assert [dtype_bytes(d) for d in ("float32", "bfloat16", "float16")] == [4, 2, 2]
    with pytest.raises(ValueError, match="resolved"):
        dtype_bytes("auto")


def test_num_kv_blocks_counts_k_and_v_of_kv_heads_only():
    # SmolLM2-135M by hand: 30 layers, 3 KV heads (not the 9 query heads), head_dim 64, bf16.
    # One 16-token block: K and V * 30 layers * 16 tokens * 3 heads * 64 dims * 2 bytes.
    per_block = 2 * 30 * 16 * 3 * 64 * 2
    assert per_block == 368_640
    assert (
        num_kv_blocks(10 * 2**20, 30, 3, 64, 2, 16) == 28
    )  # 28 * 368640 = 10321920 <= 10 MiB < 29 blocks
    assert num_kv_blocks(per_block, 30, 3, 64, 2, 16) == 1
    with pytest.raises(ValueError, match="holds no block"):
        num_kv_blocks(per_block - 1, 30, 3, 64, 2, 16)
    with pytest.raises(ValueError, match="num_kv_heads"):
        num_kv_blocks(per_block, 30, 0, 64, 2, 16)


def test_kv_budget_prefers_explicit_bytes_over_the_fraction():
    assert kv_cache_budget_bytes(EngineConfig(kv_cache_memory_fraction=0.25), 1000) == 250
    assert kv_cache_budget_bytes(EngineConfig(kv_cache_memory_bytes=123), 10**9) == 123


def test_max_model_len_defaults_to_the_model_and_cannot_exceed_it():
    assert resolve_max_model_len(EngineConfig(), 8192) == 8192
    assert resolve_max_model_len(EngineConfig(max_model_len=512), 8192) == 512
    with pytest.raises(ValueError, match="exceeds the model's context length"):
        resolve_max_model_len(EngineConfig(max_model_len=9000), 8192)


def test_bookkeeping_modules_do_not_import_torch():
    code = (
        "import sys\n"
        "import engine.config, engine.requests.request, engine.scheduling.block_manager, engine.scheduling.prefix_cache, "
        "engine.scheduling.scheduler, engine.cuda_graphs.buckets\n"
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
