"""BlockBatch: the K/V blocks of one prompt's prefix on their way between two servers.

Contract: a batch is `transfer_id` (the decode server's name for the request it waits on), the
chained block keys (engine/kv_tiers/keys.py: 128-bit, the same in every process), each
block's token ids, and `kv` `[n, layers, 2, block_size, kv_heads, head_dim]` on the CPU, in
the KV cache's dtype (or, K and V rows of two layouts, engine/kv_tiers/block_layout.py's bytes):
the bytes of the sender's pool, bit for bit. `gather(kv_caches,
block_ids, held)` copies pool blocks (by id) and already host-held blocks into one such tensor.
`namespace_digest(namespace)`: 63 bits of everything but the model's path that decides the
K/V bytes (tokenizer, dtypes, forward path, version); a receiver drops a batch whose digest is
not its own (the PyTorch and C++ paths agree to rounding only), and recomputes instead.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from engine.kv_tiers.block_layout import BlockLayout
from engine.kv_tiers.keys import TierNamespace

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]  # per layer [num_blocks, bs, heads, dim]


@dataclass(frozen=True)
class BlockBatch:
    transfer_id: int
    keys: tuple[int, ...]
    tokens: tuple[tuple[int, ...], ...]
    kv: torch.Tensor  # [n, layers, 2, block_size, kv_heads, head_dim], CPU
    digest: int  # namespace_digest of the sender's K/V

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()


def namespace_digest(namespace: TierNamespace) -> int:
    fields = (namespace.tokenizer, namespace.dtype, namespace.kv_dtype, namespace.forward_path)
    text = "\x1f".join((*fields, namespace.version))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def gather(kv_caches: KVCaches, block_ids: list[int], held: list[torch.Tensor]) -> torch.Tensor:
    """Pool blocks `block_ids` then `held` ([layers, 2, bs, heads, dim] each), on the CPU.
    Block by block, as the tier store's saves: small copies stay on one thread."""
    layout = BlockLayout.of(kv_caches)
    out = torch.empty((len(block_ids) + len(held), *layout.shape), dtype=layout.dtype)
    for i, block_id in enumerate(block_ids):
        layout.read(kv_caches, block_id, out[i])
    for i, kv in enumerate(held, start=len(block_ids)):
        out[i].copy_(kv)
    return out
