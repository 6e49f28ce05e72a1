"""Batch-invariant paged attention in plain PyTorch: keys in fixed blocks, one order per row.

Contract: `block_attention(q [T, H, D], k_cache, v_cache, plan, scale) -> [T, H, D]` in q's
dtype, for the flat rows of a step (decodes and prefill chunks, `AttentionMetadata` layout)
whose K/V are already in the cache; `BlockPlan.build(meta, group, window)` lays out the step
once (host lists -> index tensors) and every layer of that sliding window (None: none) reuses it.

The order each row's reductions follow, whatever else is in the step (issue #14):
- Keys are cut into blocks of `KEY_BLOCK` positions aligned at absolute position 0 of the
  sequence; a row (the token at position p) reads blocks 0 .. p // KEY_BLOCK (from its
  window's first block with a sliding window) in ascending order.
- Rows are grouped in tiles of `tile_rows(group)` consecutive rows of one sequence (the last
  tile repeats its last row). A tile's scores for one block are one GEMM of fixed shape
  [tile_rows * group, D] x [D, KEY_BLOCK] per KV head (float32), its values one GEMM
  [tile_rows * group, KEY_BLOCK] x [KEY_BLOCK, D]; all tiles of a block go through one
  batched matmul. A row's bits do not depend on its tile-mates nor on how many tiles share
  the call (pinned by tests/models/test_invariant_kernels.py, like the linears).
- Inside a block: masked scores are -inf, m_j = max, p = exp(s - m_j), l_j = sum over the
  block's keys (one row reduction of fixed length), acc_j = p @ V.
- Blocks are merged in ascending order by the online-softmax rule; a block with no visible
  key for a row leaves that row's (m, l, acc) untouched (torch.where), so whether a block is
  computed for a row (because a tile-mate needs it) or not changes nothing.
Keys beyond the sequence's length are masked and their values zeroed (a stale slot could
hold anything); with attention sinks (gpt-oss) exp(sink) is added to l after the last block
(both rescaled to max(m, sink)); the output is acc / l, rounded once to q's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

KEY_BLOCK = 128  # keys per block, aligned at absolute positions


def tile_rows(group: int) -> int:
    """Rows per query tile for `group` query heads per KV head: the fewest rows whose
    tile_rows * group GEMM rows fill whole 4-row micro-kernel blocks."""
    rows = 1
    while (rows * group) % 4:
        rows += 1
    return rows


@dataclass(frozen=True)
class BlockPlan:
    """Index tensors of one step, shared by all layers. U tiles, J key blocks."""

    group: int
    tile_rows: int
    tile_row_ids: torch.Tensor  # [U * tile_rows] rows of q feeding each tile
    out_rows: torch.Tensor  # [T] flat index into the tiles' rows of each real row
    blocks: list[tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor]]
    # per key block j, ascending: (tiles reading it or None for all, key slots [Uj * KEY_BLOCK],
    # key valid [Uj, KEY_BLOCK], visible [Uj, tile_rows, KEY_BLOCK])

    @classmethod
    def build(cls, meta, group: int, window: int | None) -> BlockPlan:
        qt, kb, bs = tile_rows(group), KEY_BLOCK, meta.block_size
        device = meta.block_tables.device
        rows, pos, seq_of_tile, out_rows = [], [], [], []
        start = 0
        for i, (q_len, seq_len) in enumerate(zip(meta.query_lens, meta.seq_lens_list, strict=True)):
            for t0 in range(0, q_len, qt):
                n = min(qt, q_len - t0)
                out_rows.extend(range(len(rows), len(rows) + n))
                tile = [start + t0 + r for r in range(n)]
                tile += [tile[-1]] * (qt - n)
                rows.extend(tile)
                pos.extend(seq_len - q_len + (r - start) for r in tile)
                seq_of_tile.append(i)
            start += q_len
        num_tiles = len(seq_of_tile)
        pos_t = torch.tensor(pos, dtype=torch.int64).view(num_tiles, qt)  # [U, qt]
        hi = (pos_t[:, -1] // kb).tolist()  # rows ascend in a tile: the last reads furthest
        lo = ((pos_t[:, 0] - window + 1).clamp(min=0) // kb).tolist() if window else [0] * num_tiles
        seq_t = torch.tensor(seq_of_tile, dtype=torch.int64)
        seq_lens = torch.tensor(meta.seq_lens_list, dtype=torch.int64)[seq_t]  # [U]
        tables = meta.block_tables.cpu()[seq_t]  # [U, max_blocks]
        offsets = torch.arange(kb, dtype=torch.int64)
        blocks = []
        for j in range(max(hi, default=-1) + 1):
            sel = [u for u in range(num_tiles) if lo[u] <= j <= hi[u]]
            if not sel:
                continue
            idx = torch.tensor(sel, dtype=torch.int64)
            key_pos = j * kb + offsets  # [kb]
            valid = key_pos.view(1, -1) < seq_lens[idx].view(-1, 1)  # [Uj, kb]
            col = (key_pos // bs).clamp(max=tables.shape[1] - 1)
            slots = tables[idx][:, col] * bs + key_pos % bs  # [Uj, kb]
            slots = torch.where(valid, slots, 0)
            row_pos = pos_t[idx].unsqueeze(-1)  # [Uj, qt, 1]
            visible = key_pos.view(1, 1, -1) <= row_pos
            if window:
                visible &= key_pos.view(1, 1, -1) > row_pos - window
            tiles = None if len(sel) == num_tiles else idx.to(device)
            blocks.append((tiles, slots.view(-1).to(device), valid.to(device), visible.to(device)))
        return cls(
            group,
            qt,
            torch.tensor(rows, dtype=torch.int64, device=device),
            torch.tensor(out_rows, dtype=torch.int64, device=device),
            blocks,
        )


def block_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: BlockPlan,
    scale: float,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T, H, D] -> [T, H, D]; see the module doc for the order it fixes. `softcap` (Gemma 2):
    scores become softcap * tanh(scores / softcap) before the mask and softmax. `sinks` [H]
    (gpt-oss): one more logit per head in each row's softmax denominator, with no value."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    kv_heads = k_cache.shape[2]
    group, qt = num_heads // kv_heads, plan.tile_rows
    # [U, KVH, qt * group, D]: a tile's query heads of one KV head, row-major by (row, head)
    tiles = (q.float() * scale).index_select(0, plan.tile_row_ids)
    tiles = tiles.view(-1, qt, kv_heads, group, head_dim).transpose(1, 2)
    tiles = tiles.reshape(-1, kv_heads, qt * group, head_dim)
    m = torch.full(tiles.shape[:-1] + (1,), float("-inf"), device=q.device)  # running max
    denom = torch.zeros_like(m)  # running sum of exp
    acc = torch.zeros_like(tiles)  # running sum of exp * v
    k_flat = k_cache.view(-1, kv_heads, head_dim)
    v_flat = v_cache.view(-1, kv_heads, head_dim)
    for sel, slots, valid, visible in plan.blocks:
        q_j = tiles if sel is None else tiles.index_select(0, sel)
        n = q_j.shape[0]
        k = k_flat.index_select(0, slots).view(n, KEY_BLOCK, kv_heads, head_dim).float()
        v = v_flat.index_select(0, slots).view(n, KEY_BLOCK, kv_heads, head_dim).float()
        v = v.masked_fill(~valid.view(n, KEY_BLOCK, 1, 1), 0.0)
        s = torch.matmul(q_j, k.permute(0, 2, 3, 1))  # [n, KVH, qt * group, KB]
        if softcap is not None:
            s = torch.tanh(s / softcap) * softcap
        hidden = ~visible.view(n, 1, qt, 1, KEY_BLOCK)
        s = s.view(n, kv_heads, qt, group, KEY_BLOCK).masked_fill(hidden, float("-inf"))
        s = s.view(n, kv_heads, qt * group, KEY_BLOCK)
        m_j = s.amax(-1, keepdim=True)
        seen = m_j > float("-inf")  # the row sees a key of this block
        p = torch.exp(s - torch.where(seen, m_j, 0.0))
        l_j = p.sum(-1, keepdim=True)
        acc_j = torch.matmul(p, v.transpose(1, 2))  # [n, KVH, qt * group, D]
        m_old = m if sel is None else m.index_select(0, sel)
        l_old = denom if sel is None else denom.index_select(0, sel)
        acc_old = acc if sel is None else acc.index_select(0, sel)
        m_new = torch.maximum(m_old, m_j)
        a = torch.exp(m_old - m_new)  # old part's weight (0 when nothing was seen yet)
        b = torch.exp(m_j - m_new)
        m_new = torch.where(seen, m_new, m_old)
        l_new = torch.where(seen, l_old * a + l_j * b, l_old)
        acc_new = torch.where(seen, acc_old * a + acc_j * b, acc_old)
        if sel is None:
            m, denom, acc = m_new, l_new, acc_new
        else:
            m.index_copy_(0, sel, m_new)
            denom.index_copy_(0, sel, l_new)
            acc.index_copy_(0, sel, acc_new)
    if sinks is not None:  # after the last block: exp(sink) joins the sum, rescaled to its max
        sink = sinks.float().view(1, kv_heads, 1, group).expand(1, kv_heads, qt, group)
        sink = sink.reshape(1, kv_heads, qt * group, 1)
        top = torch.maximum(m, sink)
        a = torch.exp(m - top)
        denom, acc = denom * a + torch.exp(sink - top), acc * a
    out = (acc / denom).view(-1, kv_heads, qt, group, head_dim).transpose(1, 2)
    out = out.reshape(-1, num_heads, head_dim).index_select(0, plan.out_rows)
    return out.to(q.dtype)
