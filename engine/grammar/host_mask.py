"""A step's grammar masks as host data: what the engine hands the runner (issue 38).

Contract: a grammar engine writes allowed-token bitmasks, `[G, ceil(V / 32)]` int32 with bit
`t % 32` of word `t // 32` set when token t is allowed (llguidance's and xgrammar's layout);
`unpack_bitmask(bitmask, vocab_size)` turns them into `[G, V]` bool numpy rows (True: allowed),
one byte per token. A `HostMask` names the logits rows of a step the G rows belong to, plus the
rows whose grammar work raised (`failed`: their requests fail alone, the others sample as
usual). It holds numpy arrays only: the runner floor turns it into a device `TokenMask`
(token_mask.py) after its forward, so the mask is computed on the host while the forward runs.
`PendingHostMask` is the protocol of a mask still being computed (`result()` waits for it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def unpack_bitmask(bitmask: np.ndarray, vocab_size: int) -> np.ndarray:
    """`bitmask` [G, ceil(V/32)] int32 -> [G, V] bool, True where allowed."""
    if bitmask.ndim != 2 or bitmask.dtype != np.int32:
        raise ValueError(f"bitmask must be [G, words] int32, got {bitmask.shape} {bitmask.dtype}")
    if bitmask.shape[1] != bitmask_words(vocab_size):
        raise ValueError(
            f"bitmask has {bitmask.shape[1]} words; {vocab_size} tokens need {bitmask_words(vocab_size)}"
        )
    # Little-endian int32 words: byte k holds tokens 8k..8k+7, lowest bit first.
    bytes_ = np.ascontiguousarray(bitmask).view(np.uint8)
    bits = np.unpackbits(bytes_, axis=1, bitorder="little", count=vocab_size)  # [G, V] 0/1
    return bits.view(np.bool_)


@dataclass(frozen=True)
class HostMask:
    """The allowed tokens of some logits rows of a step, on the host."""

    rows: tuple[int, ...]  # [G] distinct logits rows that are constrained, ascending
    allowed: np.ndarray  # [G, V] bool: True where the row's grammar allows the token
    failed: tuple[int, ...] = ()  # logits rows whose grammar work raised

    def __post_init__(self) -> None:
        if len(self.rows) != self.allowed.shape[0]:
            raise ValueError(f"{len(self.rows)} rows for {self.allowed.shape[0]} mask rows")

    @classmethod
    def empty(cls, vocab_size: int, failed: Sequence[int] = ()) -> HostMask:
        return cls((), np.zeros((0, vocab_size), dtype=np.bool_), tuple(failed))

    def with_failed(self, failed: Sequence[int]) -> HostMask:
        return HostMask(self.rows, self.allowed, self.failed + tuple(failed))


class PendingHostMask(Protocol):
    def result(self) -> HostMask | None: ...


@dataclass(frozen=True)
class ReadyMask:
    """A mask known before the step (or none): `result()` is it."""

    mask: HostMask | None

    def result(self) -> HostMask | None:
        return self.mask
