"""Paged attention over a flattened batch, plus the plain reference it is tested against.

A step's batch is flat: sequence i brings `query_lens[i]` new tokens (rows
`query_start_loc[i]:query_start_loc[i+1]`) and attends causally to its first `seq_lens[i]`
tokens: the cached prefix plus the new tokens. K/V live per layer in a cache of shape
`[num_blocks, block_size, num_kv_heads, head_dim]` (KV heads only, never repeated for GQA);
token t of a sequence sits in block `block_table[t // block_size]` at offset
`t % block_size`. The same code runs on CPU and CUDA (SDPA picks the kernel).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

KVCache = tuple[torch.Tensor, torch.Tensor]  # (k, v), each [num_blocks, block_size, kv_heads, head_dim]


class _AdditiveMask:
    """The plan's bool mask as 0 / -inf in the compute dtype, made once per step (SDPA would
    convert a bool mask on every call, i.e. in every layer)."""

    mask: torch.Tensor

    def additive_mask(self, dtype: torch.dtype) -> torch.Tensor:
        cached = self.__dict__.get("_additive")
        if cached is None or cached.dtype != dtype:
            cached = self.__dict__["_additive"] = _additive(self.mask, dtype)
        return cached


@dataclass
class DecodePlan(_AdditiveMask):
    """What every layer needs for the batched decode rows; built once per step."""

    rows: torch.Tensor  # [B] rows of the decode tokens in the flat batch
    tables: torch.Tensor  # [B * nb] block ids covering the longest decode context, row-major
    mask: torch.Tensor  # [B, 1, 1, L] bool: key visible to the query
    max_len: int  # L


@dataclass
class PrefillPlan(_AdditiveMask):
    """One sequence with several new tokens (a prefill chunk)."""

    row_start: int
    q_len: int
    seq_len: int
    table: torch.Tensor  # [nb] block ids covering seq_len tokens
    mask: torch.Tensor | None  # [q_len, seq_len] bool, None when plainly causal from 0


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64: flat cache slot of each new token
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int64, padded with 0
    seq_lens: torch.Tensor  # [num_seqs] int64: context length once this step's tokens are in
    query_lens: list[int]  # host copy: new tokens per sequence
    seq_lens_list: list[int]  # host copy of seq_lens, to slice without device syncs
    block_size: int = 16
    sliding_window: int | None = None
    use_cpu_kernel: bool = False  # every row through models/cpu_kernels/paged_attention (the
    # forward path, models/forward_path.py, says so: ForwardPath.attention_kernel)
    _decode: DecodePlan | None = field(default=None, init=False, repr=False)
    _rows: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, init=False, repr=False)
    _prefills: list[PrefillPlan] | None = field(default=None, init=False, repr=False)

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
        sliding_window: int | None = None,
        use_cpu_kernel: bool = False,
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
            block_size=block_size,
            sliding_window=sliding_window,
            use_cpu_kernel=use_cpu_kernel,
        )

    def decode_plan(self) -> DecodePlan | None:
        """The decode rows' gather tables and mask, computed by the first layer only."""
        if self._decode is None:
            decode = [i for i, n in enumerate(self.query_lens) if n == 1]
            if not decode:
                return None
            device = self.block_tables.device
            starts = _query_starts(self.query_lens)
            max_len = max(self.seq_lens_list[i] for i in decode)
            num_blocks = -(-max_len // self.block_size)
            if len(decode) == self.num_seqs:  # decode-only: rows and sequences are 0..B-1
                rows = torch.arange(len(decode), device=device)
                tables = self.block_tables[:, :num_blocks]
                seq_len = self.seq_lens
            else:
                seqs = torch.tensor(decode, device=device)
                rows = torch.tensor([starts[i] for i in decode], device=device)
                tables = self.block_tables[seqs, :num_blocks]
                seq_len = self.seq_lens[seqs]
            lens = seq_len.view(-1, 1, 1, 1)
            key_pos = torch.arange(max_len, device=device).view(1, 1, 1, -1)
            mask = _attend_mask(lens - 1, key_pos, lens, self.sliding_window)
            self._decode = DecodePlan(rows, tables.reshape(-1), mask, max_len)
        return self._decode

    def row_plan(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token block tables [T, nb] and context lengths [T]: the new token at position p
        of a sequence attends to its first p + 1 tokens, so every row, prefill or decode, is
        one query of the CPU kernel (models/cpu_kernels/paged_attention). Built once per step."""
        if self._rows is None:
            if self.is_decode_only:
                self._rows = (self.block_tables, self.seq_lens)
            else:
                device = self.block_tables.device
                lens: list[int] = []
                for seq_len, q_len in zip(self.seq_lens_list, self.query_lens, strict=True):
                    lens.extend(range(seq_len - q_len + 1, seq_len + 1))
                seq_of_row = torch.repeat_interleave(
                    torch.arange(self.num_seqs, device=device),
                    torch.tensor(self.query_lens, device=device),
                )
                self._rows = (
                    self.block_tables.index_select(0, seq_of_row),
                    torch.tensor(lens, dtype=torch.int64, device=device),
                )
        return self._rows

    def prefill_plans(self) -> list[PrefillPlan]:
        if self._prefills is None:
            device = self.block_tables.device
            plans, start = [], 0
            for i, q_len in enumerate(self.query_lens):
                if q_len > 1:
                    seq_len = self.seq_lens_list[i]
                    mask = None
                    if seq_len != q_len or self.sliding_window is not None:
                        key_pos = torch.arange(seq_len, device=device).view(1, -1)
                        query_pos = torch.arange(seq_len - q_len, seq_len, device=device).view(-1, 1)
                        mask = _attend_mask(query_pos, key_pos, seq_len, self.sliding_window)
                    table = self.block_tables[i, : -(-seq_len // self.block_size)]
                    plans.append(PrefillPlan(start, q_len, seq_len, table, mask))
                start += q_len
            self._prefills = plans
        return self._prefills


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    zeros = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return zeros.masked_fill(~mask, float("-inf"))


def write_kv(cache: KVCache, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Stores this step's keys/values ([num_tokens, kv_heads, head_dim]) at their slots."""
    k_cache, v_cache = cache
    kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def _attend_mask(query_pos, key_pos, seq_len, window: int | None) -> torch.Tensor:
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
    new_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """q: [num_tokens, num_heads, head_dim] -> [num_tokens, num_heads, head_dim].

    Decode rows (one new token) of all sequences go through one batched SDPA call over their
    gathered blocks; sequences with several new tokens (prefill chunks) go one at a time,
    since padding them to a common length would waste most of the work. A chunk that starts
    the sequence attends straight to this step's `new_kv` ([num_tokens, kv_heads, head_dim]
    each) instead of reading it back from the cache.
    """
    k_cache, v_cache = cache
    if meta.use_cpu_kernel:  # every row reads K/V in place through its block table
        from models.cpu_kernels.paged_attention import paged_decode_attention

        tables, lens = meta.row_plan()
        return paged_decode_attention(q, k_cache, v_cache, tables, lens, scale, meta.sliding_window)
    kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    gqa = q.shape[1] != kv_heads
    decode = meta.decode_plan()
    if decode is not None and len(decode.rows) == q.shape[0]:
        return _decode_attention(q, cache, decode, scale, gqa)
    out = torch.empty_like(q)
    if decode is not None:
        out[decode.rows] = _decode_attention(q[decode.rows], cache, decode, scale, gqa)
    for plan in meta.prefill_plans():
        rows = slice(plan.row_start, plan.row_start + plan.q_len)
        if plan.q_len == plan.seq_len and new_kv is not None:
            k, v = new_kv[0][rows], new_kv[1][rows]
        else:
            k = k_cache.index_select(0, plan.table).view(-1, kv_heads, head_dim)[: plan.seq_len]
            v = v_cache.index_select(0, plan.table).view(-1, kv_heads, head_dim)[: plan.seq_len]
        # 4-D inputs: with 3-D ones torch's CPU SDPA falls back to its slow math kernel.
        o = F.scaled_dot_product_attention(
            q[rows].transpose(0, 1).unsqueeze(0),  # [1, H, q_len, D]
            k.transpose(0, 1).unsqueeze(0),  # [1, KVH, seq_len, D]
            v.transpose(0, 1).unsqueeze(0),
            attn_mask=None if plan.mask is None else plan.additive_mask(q.dtype),
            is_causal=plan.mask is None,
            scale=scale,
            enable_gqa=gqa,
        )
        out[rows] = o[0].transpose(0, 1)
    return out


def _decode_attention(
    q: torch.Tensor, cache: KVCache, plan: DecodePlan, scale: float, gqa: bool
) -> torch.Tensor:
    """q: [B, H, D], one query per sequence -> [B, H, D]."""
    k_cache, v_cache = cache
    b, kv_heads, head_dim = q.shape[0], k_cache.shape[2], k_cache.shape[3]
    # index_select on whole blocks is a row memcpy, ~4x faster than advanced indexing on CPU.
    k = k_cache.index_select(0, plan.tables).view(b, -1, kv_heads, head_dim)[:, : plan.max_len]
    v = v_cache.index_select(0, plan.tables).view(b, -1, kv_heads, head_dim)[:, : plan.max_len]
    o = F.scaled_dot_product_attention(
        q.unsqueeze(2),  # [B, H, 1, D]
        k.transpose(1, 2),  # [B, KVH, L, D]
        v.transpose(1, 2),
        attn_mask=plan.additive_mask(q.dtype),
        scale=scale,
        enable_gqa=gqa,
    )
    return o.squeeze(2)


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
    mask = _attend_mask(query_pos, key_pos, seq_len, sliding_window)
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
