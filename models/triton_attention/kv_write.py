"""This step's keys and values stored into their cache slots by one Triton launch.

Contract: `triton_write_kv(k_cache, v_cache, k, v, slot_mapping)` stores k[t] and v[t]
(`[num_tokens, kv_heads, head_dim]`, any token stride, rows contiguous) at flat slot
`slot_mapping[t]` of the caches (`[num_blocks, block_size, kv_heads, head_dim]`: slot s is
block s // block_size, offset s % block_size), cast to the cache dtype (by torch, before
the launch, and only when the dtypes differ: the kernel copies bits). An fp8 cache
(models/kv_fp8.py) gets each row quantised by torch (`quantize_fp8_rows`: its e4m3 values and
float32 scale, `[num_tokens, kv_heads, head_dim + 4]`) and the kernel copies those rows'
bytes: Triton's interpreter casts float32 to e4m3 wrongly (7.77 -> 4.0), torch's cast is the
same on CPU and CUDA, and neither waits on the host (capture-safe). A negative slot
stores nothing: the padding rows of a fixed-size (CUDA graph) batch. Same bits as
models/attention.py `write_kv` for valid slots; one program per token, nothing is reduced.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from models.kv_fp8 import is_fp8, quantize_fp8_rows


@triton.jit
def _write_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slots_ptr,
    stride_kt,
    stride_vt,
    stride_kb,
    stride_ks,
    stride_vb,
    stride_vs,
    BLOCK_SIZE: tl.constexpr,
    ROW: tl.constexpr,  # kv_heads * head_dim: one token's keys, contiguous in k and the cache
    ROW_PAD: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + token)
    cols = tl.arange(0, ROW_PAD)
    mask = cols < tl.where(slot >= 0, ROW, 0)  # (not `& (slot >= 0)`: the interpreter
    # turns a scalar condition and-ed with a block into int32)
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    k = tl.load(k_ptr + token * stride_kt + cols, mask=mask)
    v = tl.load(v_ptr + token * stride_vt + cols, mask=mask)
    tl.store(k_cache_ptr + block * stride_kb + offset * stride_ks + cols, k, mask=mask)
    tl.store(v_cache_ptr + block * stride_vb + offset * stride_vs + cols, v, mask=mask)


def _row_contiguous(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[N, heads, dim] in `dtype` whose (heads, dim) part is one dense row, copying only when
    it is not (torch rounds to nearest even; Triton's interpreter would truncate)."""
    x = x.to(dtype)
    if x.stride(2) == 1 and x.stride(1) == x.shape[2]:
        return x
    return x.contiguous()


def kernel_constants(block_size: int, kv_heads: int, head_dim: int) -> dict[str, int]:
    """The compile-time constants of one launch (also what tests compile for the GPU)."""
    row = kv_heads * head_dim
    return {"BLOCK_SIZE": block_size, "ROW": row, "ROW_PAD": triton.next_power_of_2(row)}


def triton_write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Stores k, v [num_tokens, kv_heads, head_dim] at `slot_mapping` [num_tokens] (int64)."""
    if is_fp8(k_cache):  # the quantised rows' bytes into the caches' bytes
        k, v = quantize_fp8_rows(k), quantize_fp8_rows(v)
    num_tokens, kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    k, v = _row_contiguous(k, k_cache.dtype), _row_contiguous(v, v_cache.dtype)
    for cache in (k_cache, v_cache):  # written in place: it cannot be a copy
        if cache.stride(3) != 1 or cache.stride(2) != head_dim:
            raise ValueError("the KV cache needs each slot's [kv_heads, head_dim] contiguous")
    _write_kv_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k.stride(0),
        v.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        **kernel_constants(k_cache.shape[1], kv_heads, head_dim),
    )
