"""Token masks: which tokens a grammar allows in some rows of a step, and how the sampler uses them.

Contract: the runner floor's form of a step's grammar masks. The engine hands the runner a
`HostMask` (host_mask.py: `[G, V]` bool numpy rows, unpacked from the grammar engine's
bitmasks on the worker thread that runs beside the forward; one byte per token, ~10x cheaper to
build than float rows); `TokenMask.from_host` wraps it without a copy, and
`allowed_tokens(bitmask, vocab_size)` unpacks a bitmask straight into `[G, V]` bool rows.
A `TokenMask` names which rows of a logits batch the G rows belong to;
- `apply(logits)` sets every token a row does not allow to -inf, in place (the sampler applies
  it to its own processed copy, never to the caller's logits);
- `argmax(logits)` is the greedy pick under the mask without masking every row: the raw argmax
  of each row, re-done over the allowed tokens only for the rows whose raw pick the grammar
  refuses. It equals `argmax` of the masked logits, ties included (when the lowest index
  holding a row's maximum is allowed, it is also the lowest allowed one);
- `failed`: the rows whose mask could not be computed (their grammar work raised): the engine
  fails those requests alone, the others of the step sample as usual;
- `select(rows)` re-targets a mask when a step's targets reuse or reorder logits rows (n > 1
  forks, beam groups).
Masking adds 0 / -inf rows built from the bool rows by integer arithmetic: branch-free, so the
cost does not depend on the mask's shape (`torch.where` / `masked_fill` with a ragged bool mask
were ~8x slower on CPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from engine.grammar.host_mask import HostMask, bitmask_words, unpack_bitmask
from engine.host_transfer import to_device

_MINUS_INF_BITS = -8388608  # 0xFF800000 as int32: the bits of float32 -inf

__all__ = ["TokenMask", "additive_rows", "allowed_tokens", "bitmask_words", "row_argmax"]


def allowed_tokens(bitmask: np.ndarray, vocab_size: int) -> torch.Tensor:
    """`bitmask` [G, ceil(V/32)] int32 -> [G, V] bool, True where allowed (CPU)."""
    return torch.from_numpy(unpack_bitmask(bitmask, vocab_size))


def additive_rows(allowed: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[k, V] bool -> [k, V] of 0 where allowed, -inf elsewhere: (not allowed) times the bits of
    float32 -inf (0xFF800000) is either those bits or +0.0's, read back as float32."""
    rows = (~allowed).to(torch.int32).mul_(_MINUS_INF_BITS).view(torch.float32)
    return rows if dtype == torch.float32 else rows.to(dtype)


def row_argmax(logits: torch.Tensor) -> torch.Tensor:
    """[R, V] -> [R] int64, the lowest index of each row's maximum (torch's argmax rule).
    numpy's argmax is vectorised where torch's CPU kernel is not (~10x faster at [64, 49152])."""
    if logits.is_cpu and logits.dtype == torch.float32:
        return torch.from_numpy(logits.numpy().argmax(axis=1))
    return logits.argmax(dim=-1)


@dataclass(frozen=True)
class TokenMask:
    """The allowed tokens of some rows of a `[R, V]` logits batch."""

    rows: tuple[int, ...]  # [G] distinct logits rows that are constrained, ascending
    allowed: torch.Tensor  # [G, V] bool: True where the row's grammar allows the token
    # Logits rows whose grammar work raised: no mask, their requests fail alone (step_update)
    failed: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if len(self.rows) != self.allowed.shape[0]:
            raise ValueError(f"{len(self.rows)} rows for {self.allowed.shape[0]} mask rows")

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Sets the tokens each row does not allow to -inf in `logits` [R, V], in place."""
        additive = additive_rows(self.allowed, logits.dtype).to(logits.device, non_blocking=True)
        if self.rows == tuple(range(logits.shape[0])):
            return logits.add_(additive)
        index = to_device(self.rows, torch.int64, logits.device)
        return logits.index_add_(0, index, additive)

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """[R] int64: each row's argmax over the tokens it allows (all tokens for the rows
        this mask does not name). `logits` [R, V] is not modified."""
        if not logits.is_cpu:  # no host sync on a device: mask every row, then pick
            return self.apply(logits.clone()).argmax(dim=-1)
        tokens = row_argmax(logits)  # [R]
        index = torch.tensor(self.rows, dtype=torch.int64)
        picked = tokens[index]  # [G]
        refused = (~self.allowed[torch.arange(len(self.rows)), picked]).nonzero().squeeze(1)
        if refused.numel():  # only these rows pay for masking
            redo = index[refused]
            masked = logits[redo].add_(additive_rows(self.allowed[refused], logits.dtype))
            tokens[redo] = row_argmax(masked)
        return tokens

    @classmethod
    def from_host(cls, mask: HostMask) -> TokenMask:
        """The host mask's rows as a (CPU) tensor, without a copy; moved where applied."""
        return cls(mask.rows, torch.from_numpy(mask.allowed), mask.failed)

    def select(self, rows: Sequence[int]) -> TokenMask | None:
        """The mask of a batch whose row i is this batch's row `rows[i]`; None when none of
        them is constrained."""
        where = {row: g for g, row in enumerate(self.rows)}
        picked = [(i, where[row]) for i, row in enumerate(rows) if row in where]
        if not picked:
            return None
        if [g for _, g in picked] == list(range(len(self.rows))) and len(picked) == len(self.rows):
            allowed = self.allowed
        else:
            allowed = self.allowed[torch.tensor([g for _, g in picked], dtype=torch.int64)]
        return TokenMask(tuple(i for i, _ in picked), allowed)
