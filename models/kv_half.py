"""float16 K/V caches for float32 models (`--kv-cache-dtype float16`): half the bytes a decode
step's attention reads, stated in PyTorch for the PyTorch paths' K/V write and the tests.

Contract: the cache is `[num_blocks, block_size, kv_heads, head_dim]` float16 (no scale, no
rotation). `to_half_rows(x)` is the one rounding every writer applies to a float32 K or V value:
saturate at +-65504 (float16's largest finite value), then round to the nearest float16, ties to
even (`.to(torch.float16)`, F16C's vcvtps2ph and the C++ step's append,
models/cpu_kernels/kv_half.h, all agree). Saturating, not overflowing to inf: an inf key would
make every score of its query row inf or NaN, so one token's outlier would end its whole
sequence; no float32 model's K/V come near it in practice: the default model's stay below 25
(max |K| 21.7, max |V| 17.3 over bench/kv_cache_quality's prompts and passages, all 30 layers),
where float16's relative rounding is 2^-11. NaN stays NaN. Each value is rounded alone,
so a row's bits depend on that row only: prefix sharing, copy-on-write, preemption and the K/V
tiers (whose keys name the cache's dtype) move the rows as bytes.

Readers widen every value exactly to float32 (the C++ paged attention's (float, half) instance,
the PyTorch key-block attention's `.float()`), so a float16 cache's attention is the float32
attention over the rounded rows, bit for bit.
- `KV_CACHE_DTYPE` ("float16") / `CACHE_DTYPE`: the option's name and the cache's element type
  (which models may use it: engine/kv_sizing.py's refusal).
- `to_half_rows(x [..., D]) -> float16 [..., D]` (any float dtype in).
"""

from __future__ import annotations

import torch

KV_CACHE_DTYPE = "float16"
CACHE_DTYPE = torch.float16
HALF_MAX = 65504.0  # torch.finfo(torch.float16).max


def to_half_rows(x: torch.Tensor) -> torch.Tensor:
    """x (any float dtype) -> float16: saturated at +-65504, rounded to nearest even."""
    if x.dtype == CACHE_DTYPE:
        return x
    return x.float().clamp(-HALF_MAX, HALF_MAX).to(CACHE_DTYPE)
