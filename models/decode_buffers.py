"""Persistent device buffers of decode-only steps, and their capture-time and replay-time
builders: what a captured (CUDA graph) decode forward reads.

Contract: `DecodeBuffers(max_rows, max_blocks_per_seq, block_size, scratch_block, group,
sliding_window, device, split_decode, backend=...)` (`backend`: the attention backend the
steps' metadata names, the Triton one) allocates once, and never reallocates (a captured graph
holds the addresses), one int64 device buffer of `max_rows * (4 + max_blocks_per_seq)` values,
plus the Triton tile plan's constant tensors. A step of b rows (b: its batch bucket) reads the first
`b * (4 + W)` values laid out as [ids b | positions b | slots b | seq_lens b | tables b x W]:
every view is contiguous and sits at the same address for every step of b rows.
- `build_for_capture(b) -> DecodeStep`: the buffers hold b padding rows (valid dummy metadata);
  the step's views, for the capture to record.
- `build_for_replay(token_ids, positions, block_tables, b) -> DecodeStep | None`: this step's
  rows (one new token each: seq_len = position + 1) padded to b, written into the same
  buffers by ONE host-to-device copy (pinned staging, no wait on CUDA); the same views as
  capture gave for b. None when a block table is wider than the buffers (run the step eager).
A padding row feeds token 0 at position 0, writes its K/V into slot 0 of `scratch_block` (a
block the block manager never hands out) and attends to that one slot: it neither writes
into nor reads a live block, and every op of the forward reads only its own row's context,
so real rows come out as without padding. Block-table columns past a row's table name the
scratch block: never read (past the row's seq_len).
The tile plan of b decode rows is fixed (one tile per row, `TilePlan.for_decode`), so the
Triton kernel's grid and every tensor it reads are the same at capture and at replay.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from models.attention import AttentionForward, AttentionMetadata
from models.triton_attention.tile_plan import TilePlan

COLUMNS = 4  # ids, positions, slots, seq_lens


@dataclass(frozen=True)
class DecodeStep:
    """The forward's inputs for one bucket: views of the persistent buffers."""

    input_ids: torch.Tensor  # [b] int64
    positions: torch.Tensor  # [b] int64
    meta: AttentionMetadata


class DecodeBuffers:
    def __init__(
        self,
        max_rows: int,
        max_blocks_per_seq: int,
        block_size: int,
        scratch_block: int,
        group: int,
        sliding_window: int | None,
        device: torch.device,
        split_decode: bool = False,
        *,
        backend: AttentionForward,
    ) -> None:
        self.backend = backend
        self.max_rows = max_rows
        self.split_decode = split_decode  # TilePlan.for_decode's (the backend's rule)
        self.width = max_blocks_per_seq
        self.block_size = block_size
        self.scratch_block = scratch_block
        self.group = group
        self.sliding_window = sliding_window
        self.device = torch.device(device)
        self._flat = torch.zeros(
            max_rows * (COLUMNS + max_blocks_per_seq), dtype=torch.int64, device=self.device
        )
        self._row_ids = torch.arange(max_rows + 1, dtype=torch.int64, device=self.device)
        self._zeros = torch.zeros(max_rows, dtype=torch.int64, device=self.device)
        self._steps: dict[int, DecodeStep] = {}

    def build_for_capture(self, batch_size: int) -> DecodeStep:
        return self._write(self._host_rows([], [], [], batch_size))

    def build_for_replay(
        self,
        token_ids: Sequence[int],
        positions: Sequence[int],
        block_tables: Sequence[Sequence[int]],
        batch_size: int,
    ) -> DecodeStep | None:
        if any(len(table) > self.width for table in block_tables):
            return None
        return self._write(self._host_rows(token_ids, positions, block_tables, batch_size))

    def step(self, batch_size: int) -> DecodeStep:
        """The views of a `batch_size`-row step (made once per size, then the same objects)."""
        step = self._steps.get(batch_size)
        if step is None:
            step = self._steps[batch_size] = self._views(batch_size)
        return step

    def _host_rows(
        self,
        token_ids: Sequence[int],
        positions: Sequence[int],
        block_tables: Sequence[Sequence[int]],
        batch_size: int,
    ) -> np.ndarray:
        """[b * (4 + W)] int64: the rows in the buffers' layout, padded to b rows."""
        n, b, width, bs = len(token_ids), batch_size, self.width, self.block_size
        if not n <= b <= self.max_rows:
            raise ValueError(f"{n} rows in a step of {b}; the buffers hold {self.max_rows}")
        host = np.zeros(b * (COLUMNS + width), dtype=np.int64)
        cols = host[: COLUMNS * b].reshape(COLUMNS, b)  # ids, positions, slots, seq_lens
        tables = host[COLUMNS * b :].reshape(b, width)
        tables.fill(self.scratch_block)
        for i, table in enumerate(block_tables):
            tables[i, : len(table)] = table
        cols[0, :n] = token_ids
        cols[1, :n] = positions  # padding rows: token 0 at position 0
        pos = cols[1]
        cols[2] = tables[np.arange(b), pos // bs] * bs + pos % bs
        cols[3] = pos + 1
        return host

    def _write(self, host: np.ndarray) -> DecodeStep:
        staged = torch.from_numpy(host)
        if self.device.type == "cuda":
            staged = staged.pin_memory()
        self._flat[: host.shape[0]].copy_(staged, non_blocking=True)  # the one transfer
        return self.step(host.shape[0] // (COLUMNS + self.width))

    def _views(self, b: int) -> DecodeStep:
        flat = self._flat[: b * (COLUMNS + self.width)]
        ids, positions, slots, seq_lens = flat[: COLUMNS * b].split(b)
        tables = flat[COLUMNS * b :].view(b, self.width)
        meta = AttentionMetadata(
            slot_mapping=slots,
            block_tables=tables,
            seq_lens=seq_lens,
            query_lens=[1] * b,
            # an upper bound of every row's length; the Triton kernel reads `seq_lens` only
            seq_lens_list=[self.width * self.block_size] * b,
            block_size=self.block_size,
            sliding_window=self.sliding_window,
            backend=self.backend,
        )
        plan = TilePlan.for_decode(
            self.group,
            self.block_size,
            self.sliding_window,
            tables,
            seq_lens,
            self._row_ids,
            self._zeros,
            self.split_decode,
        )
        return DecodeStep(ids, positions, meta.use_tile_plan(plan))
