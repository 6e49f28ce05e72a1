"""The static input buffers a decode CUDA graph reads, and how a step fills them.

Contract: `StaticDecodeInputs(max_rows, max_blocks_per_seq, device)` owns one tensor per
forward input, allocated once and never reallocated (a captured graph holds their addresses):
`input_ids` [max_rows], `positions` [max_rows], `slot_mapping` [max_rows], `seq_lens`
[max_rows] (int64) and `block_tables` [max_rows, max_blocks_per_seq] (int64). A graph for
bucket b reads the first b rows of each. `fill(rows)` writes a padded step (engine/cuda_graphs/
buckets.py) into those first rows, block tables padded on the right with the row's first
block (never read: past the row's seq_len); the copies are asynchronous (engine/host_transfer)
so filling never waits for the device. `metadata(b, ...)` is the `AttentionMetadata` over the
first b rows of the buffers.

Host copies in the metadata (`query_lens`, `seq_lens_list`): a captured graph replays whatever
the host lists said at capture, so for capture they are worst case (`seq_lens_list` all
`max_model_len`): an attention kernel that sizes its launch from them covers every context
length, and reads each row's true length from the `seq_lens` tensor. Eager runs over the
buffers (CPU, tests) pass the step's own lengths.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.cuda_graphs.buckets import DecodeRows
from engine.host_transfer import to_device
from models.attention import AttentionMetadata


class StaticDecodeInputs:
    def __init__(self, max_rows: int, max_blocks_per_seq: int, device: torch.device) -> None:
        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.int64, device=device)

        self.max_rows = max_rows
        self.max_blocks_per_seq = max_blocks_per_seq
        self.device = device
        self.input_ids = zeros(max_rows)
        self.positions = zeros(max_rows)
        self.slot_mapping = zeros(max_rows)
        self.seq_lens = zeros(max_rows)
        self.block_tables = zeros(max_rows, max_blocks_per_seq)

    def fill(self, rows: DecodeRows) -> None:
        """Writes `rows` (already padded to a bucket) into the first `rows.num_rows` rows."""
        n, width = rows.num_rows, self.max_blocks_per_seq
        if n > self.max_rows:
            raise ValueError(f"{n} rows exceed the {self.max_rows} rows of the static buffers")
        tables: list[int] = []
        for table in rows.block_tables:
            if not 0 < len(table) <= width:
                raise ValueError(f"a block table of {len(table)} blocks; 1 to {width} fit")
            tables.extend(table)
            tables.extend([table[0]] * (width - len(table)))
        columns = [rows.token_ids, rows.positions, rows.slots, rows.seq_lens]
        # One host tensor, one transfer: [4 * n + n * width] int64.
        flat = to_device([v for col in columns for v in col] + tables, torch.int64, self.device)
        for i, dst in enumerate((self.input_ids, self.positions, self.slot_mapping, self.seq_lens)):
            dst[:n].copy_(flat[i * n : (i + 1) * n])
        self.block_tables[:n].copy_(flat[4 * n :].view(n, width))

    def metadata(
        self,
        bucket: int,
        block_size: int,
        sliding_window: int | None,
        use_cpu_kernel: bool,
        seq_lens_list: Sequence[int],
    ) -> AttentionMetadata:
        """The metadata of a decode step over the first `bucket` rows (see the module doc)."""
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:bucket],
            block_tables=self.block_tables[:bucket],
            seq_lens=self.seq_lens[:bucket],
            query_lens=[1] * bucket,
            seq_lens_list=list(seq_lens_list),
            block_size=block_size,
            sliding_window=sliding_window,
            use_cpu_kernel=use_cpu_kernel,
        )
