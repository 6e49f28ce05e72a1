"""A CPU kernel for paged attention with ONE query per row, reading K/V straight from the
block tables instead of gathering them into a padded copy first. Every token of a step, a
decode or a row of a prefill chunk, is such a query over its own context
(`AttentionMetadata.row_plan`), so this kernel serves whole steps, not only decodes.

Contract: `paged_decode_attention(q [B, H, D], k_cache, v_cache, block_tables [B, nb] int64,
seq_lens [B] int64, scale, sliding_window) -> [B, H, D]` in q's dtype equals SDPA of each
query against keys `max(0, seq_len - window) .. seq_len - 1` of its sequence, where token t
sits in block `block_tables[b, t // block_size]` at offset `t % block_size` of caches shaped
`[num_blocks, block_size, kv_heads, head_dim]` (contiguous, float32 / bfloat16 / float16,
same dtype as q; or float16 caches with a float32 q, models/kv_half.py: each value widened
exactly, so the float32 kernel's bits over the rounded rows), or int8 caches `[num_blocks, block_size, kv_heads, head_dim + 4]` whose rows
carry their own scale (models/kv_quant.py; q float32 or bfloat16), read in place; or, for a
float32 q, float16 K `[..., head_dim]` with int8 V rows `[..., head_dim + 4]` (`--kv-cache-dtype
int8v`: scores as the float16 cache's, the V sum as the int8 cache's). Scores, softmax and the
V sum run in float32.

The C++ source (attention.cpp) is built with the other CPU kernels at first use (see
models/cpu_kernels/__init__.py). `is_available()` says False (and logs why, once) when it
cannot be built or the device is not a CPU; callers then keep their SDPA path.
"""

from __future__ import annotations

import torch

from models import cpu_kernels
from models.kv_quant import SCALE_BYTES

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_INT8_Q_DTYPES = (torch.float32, torch.bfloat16)  # q dtypes read against int8 caches
_HALF_ROWS = {torch.float32: (torch.float16,)}  # q dtype -> other cache dtypes it reads


def _reads(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether the kernel reads caches of k_cache's dtype with queries of q's: the same dtype,
    or a float32 model's float16 rows (models/kv_half.py)."""
    return k_cache.dtype in (q.dtype, *_HALF_ROWS.get(q.dtype, ()))


def is_available(device: torch.device | str = "cpu") -> bool:
    """True when the kernel can serve tensors on `device` (a CPU and a built extension)."""
    return cpu_kernels.is_available(device)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """q: [B, H, D] (one query per row, at position seq_len - 1 of its row) -> [B, H, D]."""
    # int8v: float16 K [..., D], int8 V rows [..., D + 4]
    mixed = k_cache.dtype == torch.float16 and v_cache.dtype == torch.int8
    if (
        q.dim() != 3
        or k_cache.dim() != 4
        or v_cache.dim() != 4
        or (
            k_cache.shape[:3] != v_cache.shape[:3]
            or (k_cache.shape[3] != v_cache.shape[3]) != mixed
        )
    ):
        raise ValueError(
            f"expected q [B, H, D] and equal caches [blocks, bs, KVH, D]; got q {tuple(q.shape)},"
            f" k {tuple(k_cache.shape)}, v {tuple(v_cache.shape)}"
        )
    b, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    int8 = k_cache.dtype == torch.int8
    row = dim + SCALE_BYTES if int8 else dim
    v_row = dim + SCALE_BYTES if int8 or mixed else dim
    if k_cache.shape[3] != row or v_cache.shape[3] != v_row or heads % kv_heads != 0:
        raise ValueError(
            f"head_dim {dim} / heads {heads} do not fit the cache's {kv_heads} KV heads"
            f" of {k_cache.shape[3]} elements"
        )
    if mixed:
        if q.dtype != torch.float32:
            raise ValueError(f"float16 K with int8 V rows are read with a float32 q, got {q.dtype}")
    elif int8:
        if q.dtype not in _INT8_Q_DTYPES or v_cache.dtype != torch.int8:
            raise ValueError(f"int8 K/V caches are read with q in {_INT8_Q_DTYPES}, got {q.dtype}")
    elif q.dtype not in _DTYPES or v_cache.dtype != k_cache.dtype or not _reads(q, k_cache):
        raise ValueError(
            f"q and caches must share a dtype in {_DTYPES} (or float32 q, float16 caches); got "
            f"{q.dtype}, {k_cache.dtype}, {v_cache.dtype}"
        )
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the KV caches must be contiguous (a copy would defeat the kernel)")
    if block_tables.dim() != 2 or block_tables.shape[0] != b or seq_lens.shape != (b,):
        raise ValueError(f"need block_tables [{b}, nb] and seq_lens [{b}] for {b} queries")
    if block_tables.dtype != torch.int64 or seq_lens.dtype != torch.int64:
        raise ValueError("block_tables and seq_lens must be int64")
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1 or None, got {sliding_window}")
    ext = cpu_kernels.extension()
    if ext is None or q.device.type != "cpu":
        raise ValueError("the CPU attention kernel is unavailable here; check is_available() first")
    return ext.paged_decode(
        q.contiguous(),
        k_cache,
        v_cache,
        block_tables.contiguous(),
        seq_lens.contiguous(),
        float(scale),
        sliding_window or 0,
    )
