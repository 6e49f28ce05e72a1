"""TierMoves: the block copies between the pool and the tiers that one step asks for (plain data).

Built by the block manager's tier bridge (engine/scheduling/tier_bridge.py) while a step is
scheduled and applied by `TierStore.transfer` before its forward: `saves` first (evicted
registered blocks: block id, key, tokens), then `loads` (fresh blocks to fill: block id and the
RAM tier's block). No torch here: the scheduling floor builds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TierMoves:
    saves: tuple[tuple[int, int, tuple[int, ...]], ...] = ()  # (block id, key, tokens)
    loads: tuple[tuple[int, Any], ...] = ()  # (block id, a RamBlock to copy in)

    def __bool__(self) -> bool:
        return bool(self.saves or self.loads)
