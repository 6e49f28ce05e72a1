"""`--kv-cache-dtype fp8` in the engine's settings (models/kv_fp8.py holds the rows):
- `fp8_e4m3` is the same option (vLLM's name), stored as `fp8`;
- the pool's arithmetic: a row is head_dim e4m3 bytes and a 4-byte scale, so Llama-3-8B's
  shape (32 layers, 8 KV heads of 128, blocks of 16) gets 992 blocks of 1 GiB against bf16's
  512 (hand-computed: 2 * 32 * 16 * 8 * 132 = 1,081,344 bytes a block against 2,097,152);
- a CPU (or another device) refuses it naming the flag and what to use; CUDA takes it;
- the K/V tiers' key names the fp8 rows' layout, not bare bytes;
- copy-on-write copies an fp8 block with its rows' scales (torch has no float8 index_copy_:
  why the cache is bytes)."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.kv_sizing import kv_cache_dtype_refusal, kv_row_layout, num_kv_blocks
from engine.kv_tiers.open_store import kv_dtype_name
from engine.runner import copy_blocks
from models import kv_fp8
from models.kv_quant import cache_row_shape, cache_torch_dtype
from models.triton_attention.reference import reference_write_kv


def test_fp8_e4m3_is_fp8() -> None:
    assert EngineConfig(kv_cache_dtype="fp8_e4m3").kv_cache_dtype == "fp8"
    assert EngineConfig(kv_cache_dtype="fp8").kv_cache_dtype == "fp8"


def test_the_pool_holds_about_twice_the_tokens_of_bf16() -> None:
    row, element = kv_row_layout("fp8", 128, "bfloat16")
    assert (row, element) == (132, 1)
    assert kv_row_layout("auto", 128, "bfloat16") == (128, 2)
    gib = 1 << 30
    assert num_kv_blocks(gib, 32, 8, row, element, 16) == 992
    assert num_kv_blocks(gib, 32, 8, 128, 2, 16) == 512
    assert cache_row_shape(128, "fp8") == 132
    assert cache_torch_dtype(torch.bfloat16, "fp8") == torch.uint8
    with pytest.raises(ValueError, match="head_dim divisible by 4"):
        cache_row_shape(18, "fp8")


@pytest.mark.parametrize(
    "device,message",
    [
        ("cpu", "fp8 is for CUDA devices; on a CPU use --kv-cache-dtype int8"),
        ("mps", "fp8 is for CUDA devices; on mps use --kv-cache-dtype auto"),
        ("cuda", None),
    ],
)
def test_only_cuda_serves_fp8(device, message) -> None:
    refusal = kv_cache_dtype_refusal(EngineConfig(kv_cache_dtype="fp8"), device, "bfloat16")
    assert refusal == (message and f"--kv-cache-dtype {message}")


def test_the_tier_key_names_the_fp8_layout() -> None:
    fp8 = torch.zeros(2, 4, 2, 20, dtype=kv_fp8.CACHE_DTYPE)
    assert kv_dtype_name(fp8) == f"torch.uint8|{kv_fp8.LAYOUT}"
    assert kv_dtype_name(torch.zeros(2, dtype=torch.bfloat16)) == "torch.bfloat16"


def test_copy_on_write_moves_fp8_rows_with_their_scales() -> None:
    shape = (6, 4, 2, cache_row_shape(16, "fp8"))  # blocks of 4 tokens, 2 KV heads of 16
    caches = [
        tuple(torch.zeros(shape, dtype=cache_torch_dtype(torch.float32, "fp8")) for _ in "kv")
    ]
    k, v = torch.randn(2, 4, 2, 16, generator=torch.Generator().manual_seed(0))
    reference_write_kv(*caches[0], k, v, torch.arange(4, 8))  # block 1
    copy_blocks(caches, [(1, 4)], torch.device("cpu"))
    for cache, x in zip(caches[0], (k, v), strict=True):
        assert torch.equal(cache[4], cache[1]) and torch.equal(
            cache[1], kv_fp8.quantize_fp8_rows(x)
        )
