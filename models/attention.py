"""Paged attention over a flattened batch, plus the plain reference it is tested against.

A step's batch is flat: sequence i brings `query_lens[i]` new tokens (rows
`query_start_loc[i]:query_start_loc[i+1]`) and attends causally to its first `seq_lens[i]`
tokens: the cached prefix plus the new tokens. K/V live per layer in a cache of shape
`[num_blocks, block_size, num_kv_heads, head_dim]` (KV heads only, never repeated for GQA);
token t of a sequence sits in block `block_table[t // block_size]` at offset
`t % block_size`. The same code runs on CPU and CUDA (SDPA picks the kernel).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

KVCache = tuple[torch.Tensor, torch.Tensor]  # (k, v), each [num_blocks, block_size, kv_heads, head_dim]


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64: flat cache slot of each new token
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int64, padded with 0
    seq_lens: torch.Tensor  # [num_seqs] int64: context length once this step's tokens are in
    query_lens: list[int]  # host copy: new tokens per sequence
    seq_lens_list: list[int]  # host copy of seq_lens, to slice without device syncs

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def is_decode_only(self) -> bool:
        return all(n == 1 for n in self.query_lens)

    @classmethod
    def build(
        cls,
        block_tables: list[list[int]],
        seq_lens: list[int],
        query_lens: list[int],
        block_size: int,
        device: torch.device | str = "cpu",
    ) -> AttentionMetadata:
        """Builds the tensors from host lists (what the model runner does each step)."""
        slots: list[int] = []
        for table, seq_len, q_len in zip(block_tables, seq_lens, query_lens, strict=True):
            for pos in range(seq_len - q_len, seq_len):
                slots.append(table[pos // block_size] * block_size + pos % block_size)
        width = max((len(t) for t in block_tables), default=1) or 1
        padded = [t + [0] * (width - len(t)) for t in block_tables]
        return cls(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            block_tables=torch.tensor(padded, dtype=torch.int64, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int64, device=device),
            query_lens=list(query_lens),
            seq_lens_list=list(seq_lens),
        )


def write_kv(cache: KVCache, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Stores this step's keys/values ([num_tokens, kv_heads, head_dim]) at their slots."""
    k_cache, v_cache = cache
    kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def _attend_mask(
    query_pos: torch.Tensor, key_pos: torch.Tensor, seq_len: torch.Tensor, window: int | None
) -> torch.Tensor:
    """True where a query may look at a key: causal, inside the sequence, inside the window."""
    mask = (key_pos <= query_pos) & (key_pos < seq_len)
    if window is not None:
        mask &= key_pos > query_pos - window
    return mask


def paged_attention(
    q: torch.Tensor,
    cache: KVCache,
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """q: [num_tokens, num_heads, head_dim] -> [num_tokens, num_heads, head_dim].

    Decode rows (one new token) of all sequences go through one batched SDPA call over their
    gathered blocks; sequences with several new tokens (prefill chunks) go one at a time,
    since padding them to a common length would waste most of the work.
    """
    k_cache, v_cache = cache
    block_size, kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    num_heads = q.shape[1]
    out = torch.empty_like(q)
    decode = [i for i, n in enumerate(meta.query_lens) if n == 1]
    if decode:
        # Rows of decode sequences in the flat batch; for decode-only batches this is arange.
        starts = _query_starts(meta.query_lens)
        rows = torch.tensor([starts[i] for i in decode], device=q.device)
        seqs = torch.tensor(decode, device=q.device)
        max_len = max(meta.seq_lens_list[i] for i in decode)
        num_blocks = (max_len + block_size - 1) // block_size
        tables = meta.block_tables[seqs, :num_blocks]  # [B, nb]
        k = k_cache[tables].reshape(len(decode), -1, kv_heads, head_dim)[:, :max_len]
        v = v_cache[tables].reshape(len(decode), -1, kv_heads, head_dim)[:, :max_len]
        seq_len = meta.seq_lens[seqs].view(-1, 1, 1, 1)  # [B, 1, 1, 1]
        key_pos = torch.arange(max_len, device=q.device).view(1, 1, 1, -1)
        mask = _attend_mask(seq_len - 1, key_pos, seq_len, sliding_window)  # [B, 1, 1, L]
        o = F.scaled_dot_product_attention(
            q[rows].unsqueeze(2),  # [B, H, 1, D]
            k.transpose(1, 2).to(q.dtype),  # [B, KVH, L, D]
            v.transpose(1, 2).to(q.dtype),
            attn_mask=mask,
            scale=scale,
            enable_gqa=num_heads != kv_heads,
        )
        out[rows] = o.squeeze(2)
    start = 0
    for i, q_len in enumerate(meta.query_lens):
        if q_len > 1:
            seq_len = meta.seq_lens_list[i]
            num_blocks = (seq_len + block_size - 1) // block_size
            table = meta.block_tables[i, :num_blocks]
            k = k_cache[table].reshape(-1, kv_heads, head_dim)[:seq_len]
            v = v_cache[table].reshape(-1, kv_heads, head_dim)[:seq_len]
            key_pos = torch.arange(seq_len, device=q.device).view(1, -1)
            query_pos = torch.arange(seq_len - q_len, seq_len, device=q.device).view(-1, 1)
            mask = _attend_mask(query_pos, key_pos, torch.tensor(seq_len), sliding_window)
            o = F.scaled_dot_product_attention(
                q[start : start + q_len].transpose(0, 1),  # [H, q_len, D]
                k.transpose(0, 1).to(q.dtype),  # [KVH, seq_len, D]
                v.transpose(0, 1).to(q.dtype),
                attn_mask=mask,
                scale=scale,
                enable_gqa=num_heads != kv_heads,
            )
            out[start : start + q_len] = o.transpose(0, 1)
        start += q_len
    return out


def _query_starts(query_lens: list[int]) -> list[int]:
    starts, total = [], 0
    for n in query_lens:
        starts.append(total)
        total += n
    return starts


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Plain attention for ONE sequence whose queries are its last q_len tokens.

    q: [q_len, num_heads, head_dim]; k, v: [seq_len, kv_heads, head_dim] (the whole context).
    Written with explicit matmul and softmax in float64, for tests only.
    """
    q_len, num_heads, _ = q.shape
    seq_len, kv_heads, _ = k.shape
    group = num_heads // kv_heads
    k = k.double().repeat_interleave(group, dim=1)  # [seq_len, H, D]
    v = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    query_pos = torch.arange(seq_len - q_len, seq_len).view(-1, 1)
    key_pos = torch.arange(seq_len).view(1, -1)
    mask = _attend_mask(query_pos, key_pos, torch.tensor(seq_len), sliding_window)
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
