"""fp8 (e4m3) K/V cache rows (`--kv-cache-dtype fp8`, CUDA): the layout the Triton K/V write
stores and the Triton paged kernels read in place (models/triton_attention), stated in PyTorch.

Contract: an fp8 cache is `[num_blocks, block_size, kv_heads, head_dim + 4]` bytes
(`torch.uint8`); the row of a (token, KV head) is its `head_dim` e4m3 (float8_e4m3fn) values q
then the 4 bytes of its float32 scale s (host order), so x ~ q * s. `s = max|x| / 448` (448:
e4m3fn's largest finite value) and `q = e4m3(x * (448 / max|x|))`, torch's cast (round to
nearest even; |x * 448 / max|x|| <= 448 up to one float32 rounding, which rounds back to 448, so
no value saturates or becomes NaN), float32 arithmetic; all-zero rows: q = 0, s = 0. head_dim
must be a multiple of 4, so that every scale is 4-byte aligned (the kernels read it as a
float32). Why bytes and not a float8 tensor: the pool's block moves (copy-on-write's
index_copy_, the K/V tiers' loads on CUDA) have no float8 kernel in torch (on the CPU checked
here; on CUDA per its dispatch lists); bytes move everywhere, and the kernels view them as e4m3
at launch (no copy).
Why per (token, KV head) and inside the row, as the int8 rows (models/kv_quant.py) do: a row's
bits depend on that row alone (batch invariance; a block shared by a prefix is never
rewritten), the scale costs 4 bytes of a 132-byte row at head_dim 128 (1.94x the tokens of a
bf16 cache), and blocks move as bytes with their scales inside (prefix sharing, copy-on-write,
preemption, the K/V tiers): no second tensor to keep in step, none more for a CUDA graph to
hold. A per-tensor scale (vLLM's k_scale / v_scale, default 1.0) would clip or flush rows
whose range is not the tensor's; e4m3 keeps 3 significand bits at every magnitude, so a row's
values carry a rounding error of at most 2^-4 |x| (and s * 2^-10 below 2^-6 s, subnormals).
`LAYOUT` names this layout for the K/V tiers' keys.
- `is_fp8(cache)`: whether a cache tensor holds these rows (the only uint8 cache).
- `quantize_fp8_rows(x [..., D]) -> uint8 [..., D + 4]` (the writer's bytes, torch ops that
  run on CPU and CUDA alike, with no host sync: capture-safe).
- `row_parts(c)`: (values [..., D] float8_e4m3fn, scales [..., 1] float32) of rows, copied;
  `dequantize_fp8_rows(c [..., D + 4]) -> float64 [..., D]`: q * s, exact.
- `kernel_views(cache) -> (values, words)`: the cache as float8_e4m3fn and as float32 words
  [..., (D + 4) / 4] (a row's scale at word D / 4), views for the kernels' pointers.
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn  # the values' type; the cache itself is bytes
CACHE_DTYPE = torch.uint8
LAYOUT = "fp8-e4m3-rows-v1"
FP8_MAX = 448.0  # e4m3fn's largest finite value
SCALE_BYTES = 4  # the float32 scale at the end of each row


def is_fp8(cache: torch.Tensor) -> bool:
    return cache.dtype == CACHE_DTYPE


def check_head_dim(head_dim: int) -> None:
    if head_dim % SCALE_BYTES:
        raise ValueError(
            f"--kv-cache-dtype fp8 needs head_dim divisible by 4 (its rows end in a float32 "
            f"scale the kernels read aligned), got {head_dim}: use --kv-cache-dtype auto"
        )


def quantize_fp8_rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] (any float dtype) -> uint8 [..., D + 4]: the e4m3 values' bytes, then the
    row's scale's."""
    check_head_dim(x.shape[-1])
    x = x.float()
    amax = x.abs().amax(dim=-1, keepdim=True)  # [..., 1]
    inv = torch.where(amax > 0, FP8_MAX / amax, torch.zeros_like(amax))
    q = (x * inv).to(FP8_DTYPE).view(torch.uint8)  # [..., D]
    scale = (amax / FP8_MAX).view(torch.uint8)  # [..., 4]: the float32's bytes
    return torch.cat([q, scale], dim=-1)


def row_parts(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 rows [..., D + 4] -> (values [..., D] e4m3, scales [..., 1] float32), as copies."""
    d = cache.shape[-1] - SCALE_BYTES
    return cache[..., :d].contiguous().view(FP8_DTYPE), cache[..., d:].contiguous().view(
        torch.float32
    )


def dequantize_fp8_rows(cache: torch.Tensor) -> torch.Tensor:
    """fp8 rows [..., D + 4] -> the float64 values [..., D] they stand for, q * s (exact: 4 by
    24 significant bits)."""
    values, scale = row_parts(cache)
    return values.double() * scale.double()


def kernel_views(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The cache [..., D + 4] bytes as float8_e4m3fn (the values) and as float32 words
    [..., (D + 4) / 4] (a row's scale is word D / 4; every row starts at a multiple of 4
    bytes): views of the same storage, no copy."""
    check_head_dim(cache.shape[-1] - SCALE_BYTES)
    return cache.view(FP8_DTYPE), cache.view(torch.float32)
