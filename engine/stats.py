"""EngineStats: the figures the server's metrics read after each step (a frozen snapshot).

Counters are cumulative since start; gauges are the values at the snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineStats:
    num_running: int  # requests running
    num_waiting: int  # requests queued (incl. preempted)
    kv_blocks_used: int
    kv_blocks_total: int
    kv_block_size: int
    prefix_cache_queries: int  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int  # prompt tokens found there
    num_preemptions: int
    # Whole prompts of requests the engine scheduled, counted once at their first step (prefix-
    # cache hits included, recompute after preemption not again; as vLLM). A request aborted
    # while still queued counts nothing.
    prompt_tokens_total: int
    generation_tokens_total: int  # tokens sampled
    num_steps: int

    @property
    def kv_cache_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0
