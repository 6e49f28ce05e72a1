"""Quantized K/V cache rows (`--kv-cache-dtype int8`): the layout the C++ step writes and the C++
paged attention reads in place (models/cpu_kernels/kv_int8.h), stated in PyTorch for the pool's
allocation, the PyTorch reference and the tests.

Contract: an int8 cache is `[num_blocks, block_size, kv_heads, head_dim + 4]` int8; the row of a
(token, KV head) is its `head_dim` values q then its float32 scale s (4 bytes, host order). The
values are those of y = W x, W the unnormalised Walsh-Hadamard matrix (entries +-1, W W = P I) on
each block of P elements, P the largest power of two dividing head_dim (`rotation_block`), so
the row stands for x = W (q * s) / P; `s = max|y| / 127` and `q = round_half_even(y * (127 /
max|y|))` in [-127, 127] (all-zero rows: q = 0, s = 0), float32 arithmetic, y by butterflies
(a, b) -> (a + b, a - b) on pairs h = 1, 2, 4, ... apart (`walsh_hadamard`). The rotation spreads
RoPE'd K's few large channels over the row before one scale covers it (the QuaRot idea): on the
default model it halves the mean change of a token's log-probability for the same bytes
(PERFORMANCE.md). Each row's scale is its own and is
fixed when the row is written, so a row's bits depend on that row alone: never on what is
appended later or on its neighbours, and blocks move as bytes (prefix sharing, copy-on-write,
preemption, the K/V tiers) with their scales inside. Per token and head, not per block: a block
shared by a prefix is never rewritten, and a scale fixed by a block's first row would clip the
rows after it. `LAYOUT` names this layout for the K/V tiers' keys (a changed layout must never
read an older one's files).
- `cache_row_shape(head_dim, kv_cache_dtype)` / `cache_torch_dtype(model_dtype, kv_cache_dtype)`:
  the last dimension and element type of an allocated cache; `row_bytes` the bytes of one row
  (and of "fp8" rows, models/kv_fp8.py: e4m3 values and a float32 scale, for CUDA; of
  "float16" rows, models/kv_half.py: a float32 model's K/V rounded to float16).
- "int8v" (`MIXED`): K and V of two layouts, a float32 model's K as "float16" rows
  (models/kv_half.py) and V as "int8" rows: `part_dtypes(kv_cache_dtype)` names each part's
  layout (K's, V's), and the functions above take a part's. K holds ~88% of the int8 rows' error
  on the default model (PERFORMANCE.md), so this keeps int8 where it costs least: 3 D + 4
  bytes a (token, KV head) against 2 D + 8 for int8 and 4 D for float16.
- `quantize_rows(x [..., D]) -> int8 [..., D + 4]`, `dequantize_rows(c [..., D + 4]) -> float32
  [..., D]`: the reference write and read (W (q * s) / P in float64, rounded once to float32;
  the kernel computes with q and s directly, rotating the query and the output instead).
- `is_quantized(cache)`: whether a cache tensor holds int8 rows.
"""

from __future__ import annotations

import torch

from models import kv_fp8, kv_half

SCALE_BYTES = 4  # the float32 scale at the end of each int8 row
QMAX = 127.0
# The int8 rows' layout, in the K/V tiers' keys. v1: plain rows; v2: Walsh-Hadamard-rotated.
LAYOUT = "int8-rows-v2-walsh-hadamard"
MIXED = "int8v"  # float16 K rows, int8 V rows


def part_dtypes(kv_cache_dtype: str) -> tuple[str, str]:
    """The layouts of a cache's K and V parts: both `kv_cache_dtype`, or for "int8v" float16 K
    (models/kv_half.py) and int8 V rows."""
    if kv_cache_dtype == MIXED:
        return kv_half.KV_CACHE_DTYPE, "int8"
    return kv_cache_dtype, kv_cache_dtype


def cache_row_shape(head_dim: int, kv_cache_dtype: str) -> int:
    """The cache's last dimension: head_dim, plus the scale's bytes for int8 (and fp8) rows."""
    if kv_cache_dtype == "fp8":  # models/kv_fp8.py: e4m3 values, then a float32 scale
        kv_fp8.check_head_dim(head_dim)
    return head_dim + SCALE_BYTES if kv_cache_dtype in ("int8", "fp8") else head_dim


def cache_torch_dtype(model_dtype: torch.dtype, kv_cache_dtype: str) -> torch.dtype:
    if kv_cache_dtype == "fp8":
        return kv_fp8.CACHE_DTYPE
    if kv_cache_dtype == kv_half.KV_CACHE_DTYPE:  # a float32 model's float16 rows
        return kv_half.CACHE_DTYPE
    return torch.int8 if kv_cache_dtype == "int8" else model_dtype


def row_bytes(head_dim: int, model_dtype_bytes: int, kv_cache_dtype: str) -> int:
    """Bytes of one (token, KV head) row of K (or of V) in the pool."""
    if kv_cache_dtype in ("int8", "fp8"):
        return head_dim + SCALE_BYTES
    if kv_cache_dtype == kv_half.KV_CACHE_DTYPE:
        return head_dim * kv_half.CACHE_DTYPE.itemsize
    return head_dim * model_dtype_bytes


def is_quantized(cache: torch.Tensor) -> bool:
    return cache.dtype == torch.int8


def rotation_block(head_dim: int) -> int:
    """P: the largest power of two dividing head_dim (64 for 64, 8 for 40)."""
    return head_dim & -head_dim


def walsh_hadamard(x: torch.Tensor) -> torch.Tensor:
    """W x over the last dimension (blocks of `rotation_block`), in x's dtype: the butterflies
    on pairs h = 1, 2, 4, ... apart, each result one rounding (the C++ writer's bits)."""
    d = x.shape[-1]
    h = 1
    while h < rotation_block(d):
        pairs = x.reshape(*x.shape[:-1], d // (2 * h), 2, h)
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        x = torch.stack([a + b, a - b], dim=-2).reshape(x.shape)
        h *= 2
    return x


def quantize_rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] (any float dtype) -> int8 [..., D + 4]: the rotated values, then the row's
    scale's bytes."""
    y = walsh_hadamard(x.float())
    amax = y.abs().amax(dim=-1, keepdim=True)  # [..., 1]
    # 127 / max|y| as the C++ writer divides: a tensor over a tensor. A Python number over a
    # tensor is its reciprocal times the number in torch, one rounding more, and rounded 3 of
    # 80,000 rows otherwise (test_kv_int8_attention).
    inv = torch.where(amax > 0, torch.full_like(amax, QMAX) / amax, torch.zeros_like(amax))
    q = torch.round(y * inv).clamp(-QMAX, QMAX).to(torch.int8)
    scale = (amax / QMAX).contiguous().view(torch.int8)  # [..., 4]: the float32's bytes
    return torch.cat([q, scale], dim=-1)


def dequantize_rows(cache: torch.Tensor) -> torch.Tensor:
    """int8 rows [..., D + 4] -> the float32 values [..., D] they stand for, W (q * s) / P
    (computed in float64)."""
    d = cache.shape[-1] - SCALE_BYTES
    scale = cache[..., d:].contiguous().view(torch.float32)  # [..., 1]
    rotated = cache[..., :d].double() * scale.double()
    return (walsh_hadamard(rotated) / rotation_block(d)).float()
