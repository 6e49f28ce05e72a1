"""Attention backends: one object per attention kernel, chosen once when a forward path is
built (models/forward_path.py), that builds each step's metadata before the forward and runs
its kernel's K/V write and attention inside it.

Contract:
- `GraphSupport`: what a backend (and so its forward path, `ForwardPath.graph_support`) lets
  engine/cuda_graphs capture. NONE: every step eager (its plan is built on the host from the
  step's lengths). DECODE_ONLY: a decode-only step (one new token per sequence) may be captured
  once per batch size and replayed, its metadata in the persistent buffers of
  `decode_buffers(...)` (models/decode_buffers.py: the capture-time and replay-time
  builders); mixed steps stay eager.
- `AttentionBackend(group, block_size, sliding_window, device)` (`for_model(model, kv_caches,
  **options)` sizes one for a model's cache):
  - `build(block_tables, seq_lens, query_lens) -> AttentionMetadata`: an eager step's metadata
    from host lists: slots, padded block tables, lengths and the kernel's own host-planned
    values packed into one int64 host tensor, copied to the device once (pinned, without
    waiting, on CUDA); the kernel's plan is built here, so the layers only read it. The
    metadata names its backend (`meta.backend`): that is how the layers' `write_step_kv` and
    `paged_attention` (models/attention.py) reach the kernel; nothing branches on a kernel name.
  - `write_kv(cache, k, v, meta)`, `forward(q, cache, meta, scale)`: the kernel's K/V write
    and attention (each kernel documents the reduction order it fixes).
  - `decode_buffers(max_rows, max_blocks_per_seq, scratch_block)`: only a DECODE_ONLY backend's.
- `BlockAttentionBackend`: PyTorch key-block attention (models/block_attention.py).
  `CppAttentionBackend`: tgserve's C++ paged attention, one query per row
  (models/cpu_kernels/paged_attention), the one that reads int8 K/V caches
  (models/kv_quant.py: it also writes their rows). The Triton backend:
  models/triton_attention/backend.py.
Inside a forward the metadata is read, never built: no host list, no `.item()`, no copy from
the host (tests/engine/test_host_syncs.py, tests/models/test_capturable_decode.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Any

import torch
from torch import nn

from models.attention import AttentionMetadata, KVCache, host_layout, key_block_attention
from models.decode_buffers import DecodeBuffers
from models.kv_quant import is_quantized
from models.triton_attention.reference import reference_write_kv


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`host` on `device`; on CUDA staged in page-locked memory and copied without waiting
    (the caching host allocator keeps the staging alive until the copy has run)."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


class GraphSupport(Enum):
    NONE = "none"  # every step eager
    DECODE_ONLY = "decode_only"  # decode-only steps captured per batch size; mixed steps eager


class AttentionBackend:
    name = "attention"  # the kernel, for messages
    graph_support = GraphSupport.NONE

    def __init__(
        self, group: int, block_size: int, sliding_window: int | None, device: torch.device
    ) -> None:
        self.group = group  # query heads per KV head
        self.block_size = block_size
        self.sliding_window = sliding_window
        self.device = torch.device(device)

    @classmethod
    def for_model(cls, model: nn.Module, kv_caches: list[KVCache], **options: Any):
        """The backend of `model` over its KV cache ([num_blocks, block_size, kvh, D] each)."""
        config = model.config
        k_cache = kv_caches[0][0]
        group = config.num_heads // config.num_kv_heads  # tensor parallel keeps whole groups
        return cls(group, k_cache.shape[1], config.sliding_window, k_cache.device, **options)

    def build(
        self,
        block_tables: Sequence[Sequence[int]],
        seq_lens: Sequence[int],
        query_lens: Sequence[int],
    ) -> AttentionMetadata:
        """An eager step's metadata, copied to the device in one transfer (see the module doc)."""
        slots, padded = host_layout(block_tables, seq_lens, query_lens, self.block_size)
        num_seqs, width = len(padded), len(padded[0]) if padded else 1
        parts: list[list[int]] = [slots, list(seq_lens), [b for t in padded for b in t]]
        parts.extend(self._plan_parts(query_lens))
        host = torch.tensor([v for part in parts for v in part], dtype=torch.int64)
        views = to_device(host, self.device).split([len(part) for part in parts])
        meta = AttentionMetadata(
            slot_mapping=views[0],
            block_tables=views[2].view(num_seqs, width),
            seq_lens=views[1],
            query_lens=list(query_lens),
            seq_lens_list=list(seq_lens),
            block_size=self.block_size,
            sliding_window=self.sliding_window,
            backend=self,
        )
        return self._plan(meta, views[3:], query_lens)

    def write_kv(self, cache: KVCache, k: torch.Tensor, v: torch.Tensor, meta) -> None:
        """This step's keys/values ([num_tokens, kv_heads, head_dim]) into their slots."""
        reference_write_kv(cache[0], cache[1], k, v, meta.slot_mapping)

    def forward(self, q: torch.Tensor, cache: KVCache, meta, scale: float) -> torch.Tensor:
        """q: [num_tokens, num_heads, head_dim] -> the same shape, this step's K/V written."""
        raise NotImplementedError

    def decode_buffers(
        self, max_rows: int, max_blocks_per_seq: int, scratch_block: int
    ) -> DecodeBuffers:
        raise ValueError(f"the {self.name} attention plans on the host: no capture")

    # ----- what a backend fills in -----------------------------------------------------------
    def _plan_parts(self, query_lens: Sequence[int]) -> list[list[int]]:
        """Host-planned int64 values the kernel reads, copied with the rest (default: none)."""
        return []

    def _plan(
        self, meta: AttentionMetadata, parts: Sequence[torch.Tensor], query_lens: Sequence[int]
    ) -> AttentionMetadata:
        """`meta` with the kernel's plan built (`parts`: `_plan_parts` on the device)."""
        raise NotImplementedError


class BlockAttentionBackend(AttentionBackend):
    """PyTorch key-block attention over the cache (models/block_attention.py)."""

    name = "PyTorch key-block"

    def _plan(self, meta, parts, query_lens) -> AttentionMetadata:
        meta.block_plan(self.group)
        return meta

    def forward(self, q: torch.Tensor, cache: KVCache, meta, scale: float) -> torch.Tensor:
        return key_block_attention(q, cache, meta, scale)


class CppAttentionBackend(AttentionBackend):
    """tgserve's C++ paged attention: every row, prefill or decode, one query reading K/V in
    place through its own block table (`AttentionMetadata.row_plan`)."""

    name = "C++ paged"

    def _plan(self, meta, parts, query_lens) -> AttentionMetadata:
        meta.row_plan()
        return meta

    def write_kv(self, cache: KVCache, k: torch.Tensor, v: torch.Tensor, meta) -> None:
        """As the base class, or int8 rows with their scales into an int8 cache (V's: K's too,
        or K's float16 rows under int8v): the C++ step's own append
        (models/cpu_kernels/kv_int8.h), so both paths store the same bits."""
        if not is_quantized(cache[1]):
            super().write_kv(cache, k, v, meta)
            return
        from models import cpu_kernels

        cpu_kernels.extension().write_kv_int8(
            cache[0], cache[1], k.contiguous(), v.contiguous(), meta.slot_mapping
        )

    def forward(self, q: torch.Tensor, cache: KVCache, meta, scale: float) -> torch.Tensor:
        return self.forward_window(q, cache, meta, scale, meta.sliding_window)

    def forward_window(
        self, q: torch.Tensor, cache: KVCache, meta, scale: float, window: int | None
    ) -> torch.Tensor:
        """`forward` with a layer's own sliding window (None: none) instead of the model's:
        the kernel takes the window per call (Gemma 3's local / global layers)."""
        from models.cpu_kernels.paged_attention import paged_decode_attention

        tables, lens = meta.row_plan()
        k_cache, v_cache = cache
        return paged_decode_attention(q, k_cache, v_cache, tables, lens, scale, window)
