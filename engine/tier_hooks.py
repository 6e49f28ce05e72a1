"""Where the engine's step meets the K/V tiers behind the pool (engine/kv_tiers), in one place.

Contract: each function reads the scheduler's block manager (its `tiers`: the tier bridge,
engine/scheduling/tier_bridge.py, None without tiers) and does nothing more than before when
there are none.
- `schedule_step(scheduler, runner, idle)`: a step's start. First the runner's hook between
  requests (`runner.between_requests(idle)`); when it changed how it runs, the old way's K/V
  goes: the pool's cached prefixes are forgotten and the tiers' namespace follows the new
  forward path (their blocks are not served to it). Then `scheduler.schedule()`, and on the
  engine's thread, before the forward that may overwrite or read them, the copies it asked for (blocks evicted
  from the pool out to the tiers, then tier hits into their fresh blocks: `TierStore.transfer`);
  at a step with nothing to run, a short wait for disk reads in flight (the only work left)
  instead of a spin.
- `tier_stats(block_manager)`: the tiers' figures, or None; `close_tiers(block_manager, runner)`
  copies the pool's parked blocks out too (the head of a chain is the last to be evicted: without
  it a restart could use none of the chain) and waits for the queued disk writes (an engine's
  close: the server's exit runs no finalizer).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.kv_tiers.tier_stats import TierStats

IDLE_WAIT_S = 0.02  # a disk read holds a request back; the loop looks again this soon


def schedule_step(scheduler: Any, runner: Any, idle: Callable[[], bool]) -> Any:
    """The step's SchedulerOutput, its tier copies done."""
    bridge = scheduler.block_manager.tiers
    if runner.between_requests(idle):  # it changed how it runs
        scheduler.block_manager.forget_cached_blocks()
        if bridge is not None:
            bridge.index.set_forward_path(runner.forward_path.description)
    sched = scheduler.schedule()
    if bridge is not None:
        if moves := bridge.take_moves():
            bridge.index.transfer(runner.kv_caches, moves)
        elif sched.is_empty:
            bridge.index.wait_for_prefetches(IDLE_WAIT_S)
    return sched


def tier_stats(block_manager: Any) -> TierStats | None:
    return block_manager.tiers.index.stats() if block_manager.tiers is not None else None


def close_tiers(block_manager: Any, runner: Any) -> None:
    bridge = block_manager.tiers
    if bridge is not None:  # the pool's cached prefixes too: a restart finds whole chains
        block_manager.spill_cached_blocks()
        bridge.index.transfer(runner.kv_caches, bridge.take_moves())
        bridge.index.close()
