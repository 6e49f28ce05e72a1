"""The Triton kernels' contracts in plain PyTorch, over the same tile plan: for CPU checks that
cannot run Triton code (a `torch.compile(fullgraph=True)` trace of the decode forward: the
interpreter's kernels are not traceable). `reference_paged_attention` never serves;
`reference_write_kv` is also the PyTorch paths' K/V write (models/attention.write_kv).

Contract: `reference_paged_attention(q, k_cache, v_cache, plan, scale)` and
`reference_write_kv(k_cache, v_cache, k, v, slot_mapping)` take the arguments of
`triton_paged_attention` / `triton_write_kv` and compute what they compute (up to float32
rounding: one softmax over all of a row's keys instead of online key tiles). Every shape is
fixed by the inputs' shapes (each row reads all `max_blocks * block_size` key slots of its
table, masked), nothing reads a tensor value on the host: the same properties a captured
decode step needs. An fp8 cache (models/kv_fp8.py) is written as `quantize_fp8_rows` rows
and read dequantised (q * s in float32: one rounding of the exact product); a float16 cache
of a float32 model as `to_half_rows` rounds (models/kv_half.py: saturated at +-65504).
"""

from __future__ import annotations

import torch

from models import kv_half
from models.kv_fp8 import is_fp8, quantize_fp8_rows, row_parts
from models.triton_attention.tile_plan import TilePlan


def reference_write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Stores k, v [T, kv_heads, head_dim] at `slot_mapping` [T] (valid slots only)."""
    kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    if is_fp8(k_cache):  # the rows' bytes (models/kv_fp8.py)
        k, v = quantize_fp8_rows(k), quantize_fp8_rows(v)
    elif k_cache.dtype == kv_half.CACHE_DTYPE:  # float16 rows: saturated (models/kv_half.py)
        k, v = kv_half.to_half_rows(k), kv_half.to_half_rows(v)
    k_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def reference_paged_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: TilePlan, scale: float
) -> torch.Tensor:
    """q [T, H, D] -> [T, H, D] in q's dtype, float32 inside."""
    num_tokens, num_heads, head_dim = q.shape
    kv_heads, bs, row = k_cache.shape[2], plan.block_size, k_cache.shape[3]
    rows = torch.arange(num_tokens, device=q.device)
    seq = torch.searchsorted(plan.query_start, rows, right=True) - 1  # [T] each row's sequence
    start = plan.query_start[seq]
    q_len = plan.query_start[seq + 1] - start
    pos = plan.seq_lens[seq] - q_len + (rows - start)  # [T] absolute position of each row
    key_pos = torch.arange(plan.block_tables.shape[1] * bs, device=q.device)  # [K]
    slots = plan.block_tables[seq][:, key_pos // bs] * bs + key_pos % bs  # [T, K]
    visible = key_pos.view(1, -1) <= pos.view(-1, 1)  # causal: also inside the sequence
    if plan.sliding_window is not None:
        visible &= key_pos.view(1, -1) > pos.view(-1, 1) - plan.sliding_window
    k = _rows(k_cache.view(-1, kv_heads, row), slots)  # [T, K, KVH, D] float32
    v = _rows(v_cache.view(-1, kv_heads, row), slots)
    v = v.masked_fill(~visible.view(num_tokens, -1, 1, 1), 0.0)  # stale slots never reach a row
    group = num_heads // kv_heads
    qg = q.float().view(num_tokens, kv_heads, group, head_dim)
    scores = torch.einsum("tkgd,tnkd->tkgn", qg, k) * scale  # [T, KVH, G, K]
    scores = scores.masked_fill(~visible.view(num_tokens, 1, 1, -1), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("tkgn,tnkd->tkgd", probs, v)
    return out.reshape(num_tokens, num_heads, head_dim).to(q.dtype)


def _rows(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """cache [S, KVH, row] at `slots` [T, K] -> [T, K, KVH, D] float32, fp8 rows dequantised."""
    if not is_fp8(cache):
        return cache[slots].float()
    values, scale = row_parts(cache[slots])
    return values.float() * scale
