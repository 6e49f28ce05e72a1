"""Level-1 sleep of an engine: its KV pool's memory given back, and taken again on wake-up.

Contract (the server's sleep mode, server/sleep.py, calls these with the engine's loop stopped,
so nothing steps meanwhile):
- `release_kv_pool(engine)` frees the storage behind every K and V tensor of the pool (the
  tensors stay, empty: the forward paths and the C++ decoder hold them and read their data
  pointers at each call) and forgets the prefix cache, whose K/V goes with it. It refuses
  (ValueError, a message a user can act on) while requests are in flight, and on a runner whose
  decode steps replay captured CUDA graphs (they hold the old addresses: sleep at level 2 or
  serve with --enforce-eager). Returns the bytes freed.
- `restore_kv_pool(engine)` allocates them again (contents undefined: no block is computed)
  and returns the bytes taken.
Level 2 (weights too) is the server dropping the engine and building a new one from the model
source at wake-up.
"""

from __future__ import annotations

from typing import Any

from models.host_memory import release_freed_memory


def _pool_tensors(engine: Any) -> list[Any]:
    return [t for pair in engine.runner.kv_caches for t in pair]


def release_kv_pool(engine: Any) -> int:
    if engine.has_unfinished_requests():
        raise ValueError("requests are in flight; sleep when the server is idle")
    if getattr(engine.runner, "decode_graphs", None) is not None:
        raise ValueError(
            "decode steps replay CUDA graphs that hold the KV pool's addresses: sleep at "
            "level 2, or serve with --enforce-eager"
        )
    if engine.config.parallel_world_size > 1 or not hasattr(engine.runner, "kv_caches"):
        raise ValueError(
            "level 1 frees one process's KV pool: with tensor or pipeline parallel, sleep at "
            "level 2"
        )
    engine.scheduler.block_manager.forget_cached_blocks()
    freed = 0
    for tensor in _pool_tensors(engine):
        storage = tensor.untyped_storage()
        freed += storage.nbytes()
        storage.resize_(0)
    release_freed_memory()
    return freed


def restore_kv_pool(engine: Any) -> int:
    taken = 0
    for tensor in _pool_tensors(engine):
        nbytes = (tensor.storage_offset() + tensor.numel()) * tensor.element_size()
        tensor.untyped_storage().resize_(nbytes)
        taken += nbytes
    return taken
