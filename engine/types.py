"""The engine's bottom floor: the plain values every room above passes around.

Contract: frozen, torch-free, importing nothing of the engine. `TokenLogprob` is one scored
token (its id, its logprob, and the top-N alternatives, best first); `FINISH_REASONS` are the
only reasons a sequence ends with (`FinishReason`); `RequestId` and `SeqId` name what the
engine keys requests (unique among live requests) and a request's sequences (unique within it,
never reused) by.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

RequestId: TypeAlias = str
SeqId: TypeAlias = int
FinishReason: TypeAlias = Literal["stop", "length", "abort", "error"]

FINISH_REASONS: tuple[FinishReason, ...] = ("stop", "length", "abort", "error")


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # the top-N (token_id, logprob), best first
