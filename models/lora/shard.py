"""One tensor-parallel rank's part of a LoRA adapter, cut as its base projection is cut
(models/parallel/shard.py).

Contract, per checkpoint module (lora_A `a` [r, K], lora_B `b` [N, r], full shapes):
- column-parallel (q, k, v: the rank's query / KV heads' rows; gate, up: its intermediate
  rows): A whole, B's rows the base weight's rows on this rank. Each slice is cut on its own,
  so the fused q|k|v and gate|up stacks hold the rank's rows of each slice side by side, as
  the fused base weight does.
- row-parallel (o: the rank's query heads' columns; down: its intermediate columns): A's
  columns the base weight's columns, B whole. The rank's expand of its partial shrink is added
  to its partial base output before the all-reduce (models/parallel/layers.py): the product
  is linear in A's columns, so the sum over ranks is the full delta.
`local_shape(module, k, n)` is the (K, N) a rank's stack holds for that module.
"""

from __future__ import annotations

import torch

from models.parallel.layout import Range, ShardLayout


class LoraShard:
    def __init__(self, layout: ShardLayout, head_dim: int) -> None:
        d = head_dim
        (h0, h1), (k0, k1) = layout.heads, layout.kv_heads
        heads, kv_heads = (h0 * d, h1 * d), (k0 * d, k1 * d)
        self.rows: dict[str, Range] = {  # column-parallel: B's output rows kept
            "q_proj": heads,
            "k_proj": kv_heads,
            "v_proj": kv_heads,
            "gate_proj": layout.intermediate,
            "up_proj": layout.intermediate,
        }
        self.columns: dict[str, Range] = {"o_proj": heads, "down_proj": layout.intermediate}

    def local_shape(self, module: str, k: int, n: int) -> tuple[int, int]:
        if module in self.rows:
            lo, hi = self.rows[module]
            return k, hi - lo
        lo, hi = self.columns[module]
        return hi - lo, n

    def cut(self, module: str, a: torch.Tensor, b: torch.Tensor):
        """(a [r, K_local], b [N_local, r]): the rank's part of the module's pair."""
        if module in self.rows:
            lo, hi = self.rows[module]
            return a, b[lo:hi]
        lo, hi = self.columns[module]
        return a[:, lo:hi], b
