"""A forward path's attention backend: everything a step's attention reads, built before the
forward, and what the path promises CUDA graphs.

Contract:
- `GraphSupport`: what a forward path (models/forward_path.py, `ForwardPath.graph_support`)
  lets engine/cuda_graphs capture. NONE: every step eager (its attention plans keys on the host
  from the step's lengths). DECODE_ONLY: a decode-only step (one new token per sequence) may
  be captured once per batch size and replayed, its metadata in the persistent buffers of
  `decode_buffers(...)` (models/decode_buffers.py); mixed steps stay eager.
- `AttentionBackend(kernel, group, block_size, sliding_window, device, split_decode)`, one
  per forward path (`AttentionBackend.for_model(model, kv_caches, kernel, split_decode)`;
  `split_decode`: Triton decode-only steps of a few rows may split each row's keys across
  programs, tile_plan.decode_splits, the same rule in eager and captured steps):
  - `build(block_tables, seq_lens, query_lens) -> AttentionMetadata`: an eager step's metadata
    from host lists: slots, padded block tables, lengths and (Triton) the tile plan packed into
    one int64 host tensor and copied to the device once (pinned, without waiting, on CUDA);
    the kernel's plan is built here, so the layers only read it.
  - `decode_buffers(max_rows, max_blocks_per_seq, scratch_block) -> DecodeBuffers`: the
    persistent buffers and the capture / replay builders of decode steps (Triton only).
Inside a forward the metadata is read, never built: no host list, no `.item()`, no copy from
the host (tests/engine/test_host_syncs.py, tests/models/test_capturable_decode.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

import torch
from torch import nn

from models.attention import AttentionKernel, AttentionMetadata, KVCache, host_layout
from models.decode_buffers import DecodeBuffers
from models.triton_attention.tile_plan import TilePlan, decode_splits, tile_layout


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
    def __init__(
        self,
        kernel: AttentionKernel,
        group: int,
        block_size: int,
        sliding_window: int | None,
        device: torch.device,
        split_decode: bool = False,
    ) -> None:
        self.kernel = kernel
        self.group = group  # query heads per KV head
        self.block_size = block_size
        self.sliding_window = sliding_window
        self.device = torch.device(device)
        # Triton: decode-only steps of a few rows may split each row's keys across programs
        # (tile_plan.decode_splits); off where batch invariance is promised
        self.split_decode = split_decode

    @classmethod
    def for_model(
        cls,
        model: nn.Module,
        kv_caches: list[KVCache],
        kernel: AttentionKernel,
        split_decode: bool = False,
    ) -> AttentionBackend:
        """The backend of `model` over its KV cache ([num_blocks, block_size, kvh, D] each)."""
        config = model.config
        k_cache = kv_caches[0][0]
        return cls(
            kernel,
            config.num_heads // config.num_kv_heads,  # tensor parallel keeps whole groups
            k_cache.shape[1],
            config.sliding_window,
            k_cache.device,
            split_decode,
        )

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
        if self.kernel is AttentionKernel.TRITON:
            parts.extend(tile_layout(query_lens, self.group))
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
            kernel=self.kernel,
        )
        if self.kernel is not AttentionKernel.TRITON:
            return meta.with_plans(self.group)  # host-side plans (CPU paths)
        plan = TilePlan(
            self.group,
            self.block_size,
            self.sliding_window,
            meta.block_tables,
            meta.seq_lens,
            query_start=views[3],
            tile_seq=views[4],
            tile_first=views[5],
            decode_splits=decode_splits(query_lens, self.split_decode),
        )
        return meta.use_tile_plan(plan)

    def decode_buffers(
        self, max_rows: int, max_blocks_per_seq: int, scratch_block: int
    ) -> DecodeBuffers:
        if self.kernel is not AttentionKernel.TRITON:
            raise ValueError(f"the {self.kernel.value} attention plans on the host: no capture")
        return DecodeBuffers(
            max_rows,
            max_blocks_per_seq,
            self.block_size,
            scratch_block,
            self.group,
            self.sliding_window,
            self.device,
            self.split_decode,
        )
