"""The parallel layers a sharded model runs (Megatron-style).

- Column-parallel linears (qkv, gate-up) need no layer of their own: a rank's shard is a plain
  `nn.Linear` holding its output rows, and its output is the rank's heads / columns.
- `RowParallelLinear` (out projection, down projection): holds the input columns matching the
  rank's heads / MLP columns, computes its partial product and all-reduces it (one all-reduce
  per layer); the bias, if any, lives on rank 0 only, so it is added once. A LoRA adapter's
  partial delta (`lora`) joins the partial product before the all-reduce.
- `VocabParallelEmbedding`: a rank holds rows [lo, hi) of the table; ids outside them give
  zero rows, and the all-reduce sums exactly one non-zero row per token (an exact result).
- `ParallelLMHead`: a rank's logits for its vocabulary rows, gathered on every rank into
  [R, vocab] (same values as the full head: each logit is one row's dot product).
Shapes in the docstrings are per rank.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from models.parallel.group import ParallelGroup
from models.parallel.layout import even_split


class RowParallelLinear(nn.Linear):
    """y [T, out] = all_reduce(x_shard [T, in_shard] @ W_shard^T) (+ bias on rank 0)."""

    group: ParallelGroup
    # LoRA adapters (models/lora/bank.py): (x, partial y) -> partial y + the rank's partial delta
    lora: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.local_forward(x)
        if self.lora is not None:  # before the sum: the delta is linear in x's columns too
            y = self.lora(x, y)
        return self.group.all_reduce(y)

    def local_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The rank's partial product; models/linear_backend points it at its CPU kernel."""
        return F.linear(x, self.weight, self.bias)


class VocabParallelEmbedding(nn.Module):
    def __init__(self, weight: torch.Tensor, vocab: tuple[int, int], group: ParallelGroup) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)  # [hi - lo, hidden]
        self.lo, self.hi = vocab
        self.group = group

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        mine = (input_ids >= self.lo) & (input_ids < self.hi)  # [T]
        local = torch.where(mine, input_ids - self.lo, 0)
        x = F.embedding(local, self.weight)  # [T, hidden]
        x = x.masked_fill(~mine.unsqueeze(-1), 0)
        return self.group.all_reduce(x)


class ParallelLMHead(nn.Module):
    def __init__(self, weight: nn.Parameter, vocab_size: int, width: int, group: ParallelGroup):
        super().__init__()
        self.weight = weight  # [hi - lo, hidden]; shared with the embedding when tied
        self.vocab_size, self.width, self.group = vocab_size, width, group

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [R, hidden] -> [R, vocab] in the model dtype, on every rank."""
        return self.gather(F.linear(hidden, self.weight))

    def gather(self, local: torch.Tensor) -> torch.Tensor:
        """local [R, rows of this rank] -> [R, vocab]: every rank's logits side by side."""
        full = self.group.gather_columns(local, self.width)
        if self.width * self.group.world == self.vocab_size:
            return full
        # Near-equal shards: rank r's rows start at its offset, its block at r * width.
        blocks = full.view(full.shape[0], self.group.world, self.width)
        world = self.group.world
        sizes = [
            hi - lo for lo, hi in (even_split(self.vocab_size, world, r) for r in range(world))
        ]
        return torch.cat([blocks[:, r, :n] for r, n in enumerate(sizes)], dim=1)
