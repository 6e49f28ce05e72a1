"""TierStats: the K/V tiers' figures for stats and metrics (plain data, no torch).

Hits are counted in blocks as they are loaded into the pool (RAM) or read from disk and staged
in RAM (disk); bytes are the K/V bytes moved; `*_bytes` gauges are what each tier holds now.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TierStats:
    ram_hits: int  # blocks loaded into the pool from the RAM tier
    ram_hit_bytes: int
    ram_bytes: int  # held now
    ram_blocks: int
    disk_hits: int  # blocks read from disk (staged in RAM, then loaded)
    disk_hit_bytes: int
    disk_bytes: int  # held now
    disk_written_bytes: int
    disk_rejected: int  # corrupt, truncated or stale files ignored
    saved_blocks: int  # blocks copied out of the pool on eviction
