"""BlockLayout: one pool block's K and V, every layer, as the one tensor the K/V tiers hold and
engine/kv_transfer sends (a RAM block, a disk file's payload, a transferred block).

Contract: `BlockLayout.of(kv_caches)` over the pool (per layer (K, V) `[num_blocks, bs, heads,
row]`). When K and V rows are alike (one dtype, one row) a block is `[layers, 2, bs, heads,
row]` of the cache's dtype (K at index 0, V at 1), as it always was. When they differ
(`--kv-cache-dtype int8v`: float16 K rows of 2 D bytes, int8 V rows of D + 4) a block is
`[layers, 1, bs, heads, K bytes + V bytes]` uint8: each (token, head)'s K row's bytes, then its
V row's. Either way the bytes are the pool's, bit for bit (dimension 2 is the block size, which
the transfer channel reads). `views(kv, layer)` are the (K, V) parts of a block tensor for one
layer, shaped and typed as `cache[block_id]`, so `read` / `write` are plain copies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]  # per layer [num_blocks, bs, heads, row]


@dataclass(frozen=True)
class BlockLayout:
    shape: tuple[int, ...]  # one block's tensor
    dtype: torch.dtype
    k_bytes: int  # bytes of a (token, head)'s K row when K and V differ, else 0

    @classmethod
    def of(cls, kv_caches: KVCaches) -> BlockLayout:
        k0, v0 = kv_caches[0]
        if k0.dtype == v0.dtype and k0.shape == v0.shape:
            return cls((len(kv_caches), 2, *k0.shape[1:]), k0.dtype, 0)
        k_bytes = k0.shape[3] * k0.element_size()
        row = k_bytes + v0.shape[3] * v0.element_size()
        return cls((len(kv_caches), 1, *k0.shape[1:3], row), torch.uint8, k_bytes)

    def views(self, kv: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Block tensor `kv`'s K and V parts of `layer`, as the caches' blocks ([bs, heads,
        row] of each cache's dtype; the mixed layout's as strided byte views of `kv`)."""
        if not self.k_bytes:
            return kv[layer, 0], kv[layer, 1]
        rows = kv[layer, 0]  # [bs, heads, K bytes + V bytes]
        return rows[..., : self.k_bytes], rows[..., self.k_bytes :]

    def _pool_part(self, block: torch.Tensor) -> torch.Tensor:
        """A pool block of one cache as this layout holds it (its bytes when K and V differ)."""
        return block.view(torch.uint8) if self.k_bytes else block

    def read(self, kv_caches: KVCaches, block_id: int, out: torch.Tensor) -> None:
        """out (a block tensor of this layout) <- pool block `block_id`."""
        for layer, (k_cache, v_cache) in enumerate(kv_caches):
            k, v = self.views(out, layer)
            k.copy_(self._pool_part(k_cache[block_id]))
            v.copy_(self._pool_part(v_cache[block_id]))

    def write(self, kv_caches: KVCaches, block_id: int, kv: torch.Tensor) -> None:
        """Pool block `block_id` <- kv (a block tensor of this layout)."""
        for layer, (k_cache, v_cache) in enumerate(kv_caches):
            k, v = self.views(kv, layer)
            self._pool_part(k_cache[block_id]).copy_(k)
            self._pool_part(v_cache[block_id]).copy_(v)
