"""Token masks: which tokens a grammar allows in some rows of a step, in the form the sampler adds.

Contract: a grammar engine writes allowed-token bitmasks, `[G, ceil(V / 32)]` int32 with bit
`t % 32` of word `t // 32` set when token t is allowed (llguidance's and xgrammar's layout).
`additive_mask(bitmask, vocab_size)` turns them into `[G, V]` float32 rows of 0 (allowed) and
-inf (not): adding is branch-free, so it costs the same whatever the mask looks like (a
`masked_fill` with a ragged mask was ~8x slower on CPU). A `TokenMask` names which rows of a
logits batch the G additive rows belong to; `apply(logits)` adds them in place; `select(rows)`
re-targets a mask when a step's targets reuse or reorder logits rows (n > 1 forks, beam groups).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from engine.host_transfer import to_device

_ALLOWED_TO_ADD = np.array([-np.inf, 0.0], dtype=np.float32)  # bit 0 -> -inf, bit 1 -> 0


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def additive_mask(bitmask: np.ndarray, vocab_size: int) -> torch.Tensor:
    """`bitmask` [G, ceil(V/32)] int32 -> [G, V] float32 of 0 / -inf (CPU)."""
    if bitmask.ndim != 2 or bitmask.dtype != np.int32:
        raise ValueError(f"bitmask must be [G, words] int32, got {bitmask.shape} {bitmask.dtype}")
    if bitmask.shape[1] != bitmask_words(vocab_size):
        raise ValueError(
            f"bitmask has {bitmask.shape[1]} words; {vocab_size} tokens need {bitmask_words(vocab_size)}"
        )
    # Little-endian int32 words: byte k holds tokens 8k..8k+7, lowest bit first.
    bits = np.unpackbits(np.ascontiguousarray(bitmask).view(np.uint8), axis=1, bitorder="little")
    return torch.from_numpy(np.take(_ALLOWED_TO_ADD, bits[:, :vocab_size]))


@dataclass(frozen=True)
class TokenMask:
    """Additive masks for some rows of a `[R, V]` logits batch."""

    rows: tuple[int, ...]  # [G] distinct logits rows that are constrained, ascending
    additive: torch.Tensor  # [G, V] float32: 0 where allowed, -inf elsewhere

    def __post_init__(self) -> None:
        if len(self.rows) != self.additive.shape[0]:
            raise ValueError(f"{len(self.rows)} rows for {self.additive.shape[0]} mask rows")

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Adds the masks to their rows of `logits` [R, V], in place; returns `logits`."""
        additive = to_device(self.additive, torch.float32, logits.device)  # no wait
        if self.rows == tuple(range(logits.shape[0])):
            return logits.add_(additive)
        index = to_device(self.rows, torch.int64, logits.device)
        return logits.index_add_(0, index, additive)

    def select(self, rows: Sequence[int]) -> TokenMask | None:
        """The mask of a batch whose row i is this batch's row `rows[i]`; None when none of
        them is constrained."""
        where = {row: g for g, row in enumerate(self.rows)}
        picked = [(i, where[row]) for i, row in enumerate(rows) if row in where]
        if not picked:
            return None
        if [g for _, g in picked] == list(range(len(self.rows))) and len(picked) == len(self.rows):
            additive = self.additive
        else:
            additive = self.additive[torch.tensor([g for _, g in picked], dtype=torch.int64)]
        return TokenMask(tuple(i for i, _ in picked), additive)
