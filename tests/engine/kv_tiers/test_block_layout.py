"""engine/kv_tiers/block_layout.py: a pool block's K and V as one tier / transfer tensor.

- K and V rows alike: `[layers, 2, bs, heads, row]` of the cache's dtype, K then V (the shape
  the tiers' files and the transfer channel always had);
- int8v's two layouts (float16 K rows of 2 D bytes, int8 V rows of D + 4): `[layers, 1, bs,
  heads, 3 D + 4]` uint8;
- either way a block read out of one pool and written into another block (of another pool)
  restores the same bytes, every layer, and touches no other block.
Oracle: the pools' own bytes."""

from __future__ import annotations

import pytest
import torch

from engine.kv_tiers.block_layout import BlockLayout


def pool(kinds: tuple[torch.dtype, torch.dtype], rows: tuple[int, int], seed: int):
    gen = torch.Generator().manual_seed(seed)
    caches = []
    for _ in range(3):  # layers
        parts = []
        for dtype, row in zip(kinds, rows, strict=True):
            x = torch.randint(-127, 128, (6, 4, 2, row), generator=gen, dtype=torch.int8)
            parts.append(x if dtype == torch.int8 else x.to(dtype) / 7)
        caches.append(tuple(parts))
    return caches


@pytest.mark.parametrize(
    "kinds,rows,shape,dtype",
    [
        ((torch.float32, torch.float32), (16, 16), (3, 2, 4, 2, 16), torch.float32),
        ((torch.int8, torch.int8), (20, 20), (3, 2, 4, 2, 20), torch.int8),
        ((torch.float16, torch.int8), (16, 20), (3, 1, 4, 2, 52), torch.uint8),  # int8v
    ],
)
def test_a_block_moves_out_and_back_as_the_same_bytes(kinds, rows, shape, dtype) -> None:
    src, dst = pool(kinds, rows, seed=1), pool(kinds, rows, seed=2)
    before = [(k.clone(), v.clone()) for k, v in dst]
    layout = BlockLayout.of(src)
    assert (layout.shape, layout.dtype) == (shape, dtype)
    block = torch.empty(layout.shape, dtype=layout.dtype)
    layout.read(src, 3, block)
    layout.write(dst, 5, block)
    for (sk, sv), (dk, dv), (bk, bv) in zip(src, dst, before, strict=True):
        assert torch.equal(dk[5].view(torch.uint8), sk[3].view(torch.uint8))
        assert torch.equal(dv[5].view(torch.uint8), sv[3].view(torch.uint8))
        others = [i for i in range(6) if i != 5]
        assert torch.equal(dk[others], bk[others]) and torch.equal(dv[others], bv[others])
