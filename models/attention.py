"""Paged attention over a flattened batch, plus the plain reference it is tested against.

A step's batch is flat: sequence i brings `query_lens[i]` new tokens (rows
`query_start_loc[i]:query_start_loc[i+1]`) and attends causally to its first `seq_lens[i]`
tokens: the cached prefix plus the new tokens. K/V live per layer in a cache of shape
`[num_blocks, block_size, num_kv_heads, head_dim]` (KV heads only, never repeated for GQA);
token t of a sequence sits in block `block_table[t // block_size]` at offset
`t % block_size`. The attention itself is models/block_attention.py, the C++ kernel
(models/cpu_kernels) or, on a GPU, the Triton kernels (models/triton_attention), each behind
an attention backend object (models/attention_backend.py) chosen once by the forward path: it
builds the metadata, its kernel's plan included, before the forward, and the metadata names
it (`meta.backend`), so `write_step_kv` and `paged_attention` go to its kernel without asking
which one it is. Metadata built by hand (`AttentionMetadata.build`, tests) names a backend or
none (the PyTorch key-block attention); the lazy plan builders here serve it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from models.block_attention import BlockPlan, block_attention
from models.triton_attention.reference import reference_write_kv
from models.triton_attention.tile_plan import TilePlan

KVCache = tuple[
    torch.Tensor, torch.Tensor
]  # (k, v), each [num_blocks, block_size, kv_heads, head_dim]


class AttentionForward(Protocol):
    """What a layer calls on the backend its metadata names (models/attention_backend.py)."""

    def write_kv(
        self, cache: KVCache, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata
    ) -> None: ...

    def forward(
        self, q: torch.Tensor, cache: KVCache, meta: AttentionMetadata, scale: float
    ) -> torch.Tensor: ...


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64: flat cache slot of each new token
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int64, padded with 0
    seq_lens: torch.Tensor  # [num_seqs] int64: context length once this step's tokens are in
    query_lens: list[int]  # host copy: new tokens per sequence
    seq_lens_list: list[int]  # host copy of seq_lens, to slice without device syncs
    block_size: int = 16
    sliding_window: int | None = None
    backend: AttentionForward | None = None  # what built it (None: key-block attention)
    # [num_tokens] int64: each new token's LoRA adapter slot, -1 for the base model; None when
    # no row of the step uses an adapter (models/lora/bank.py).
    lora_rows: torch.Tensor | None = None
    _rows: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, init=False, repr=False)
    _blocks: BlockPlan | None = field(default=None, init=False, repr=False)
    # Plans of layers with their own window (Gemma 2 / 3), by (group, window).
    _layer_blocks: dict[tuple[int, int | None], BlockPlan] = field(
        default_factory=dict, init=False, repr=False
    )
    _tiles: TilePlan | None = field(default=None, init=False, repr=False)

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
        seq_lens: Sequence[int],
        query_lens: Sequence[int],
        block_size: int,
        device: torch.device | str = "cpu",
        sliding_window: int | None = None,
        backend: AttentionForward | None = None,
    ) -> AttentionMetadata:
        """Builds the tensors from host lists (tests; the engine's steps go through the forward
        path's backend, models/attention_backend.py, which copies them in one transfer)."""
        slots, padded = host_layout(block_tables, seq_lens, query_lens, block_size)
        return cls(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            block_tables=torch.tensor(padded, dtype=torch.int64, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int64, device=device),
            query_lens=list(query_lens),
            seq_lens_list=list(seq_lens),
            block_size=block_size,
            sliding_window=sliding_window,
            backend=backend,
        )

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

    def use_tile_plan(self, plan: TilePlan) -> AttentionMetadata:
        """Itself with `plan` as its Triton tile plan (one built on the device, e.g. a decode
        batch's fixed plan, models/decode_buffers.py)."""
        self._tiles = plan
        return self

    def block_plan(self, group: int) -> BlockPlan:
        """The key-block layout of models/block_attention for `group` query heads per KV
        head, built by the first layer only."""
        if self._blocks is None or self._blocks.group != group:
            self._blocks = BlockPlan.build(self, group, self.sliding_window)
        return self._blocks

    def window_plan(self, group: int, window: int | None) -> BlockPlan:
        """The key-block layout for layers whose sliding window is their own (None: global),
        not the model's `sliding_window`: built once per step and window."""
        key = (group, window)
        if key not in self._layer_blocks:
            self._layer_blocks[key] = BlockPlan.build(self, group, window)
        return self._layer_blocks[key]

    def tile_plan(self, group: int) -> TilePlan:
        """The query tiles of models/triton_attention for `group` query heads per KV head,
        built by the first layer only."""
        if self._tiles is None or self._tiles.group != group:
            self._tiles = TilePlan.build(self, group)
        return self._tiles


def host_layout(
    block_tables: Sequence[Sequence[int]],
    seq_lens: Sequence[int],
    query_lens: Sequence[int],
    block_size: int,
) -> tuple[list[int], list[list[int]]]:
    """A step's host lists as the metadata lays them out: the flat slot of each new token
    [T], and the block tables padded with 0 to the widest [S][max_blocks] (at least 1)."""
    slots: list[int] = []
    for table, seq_len, q_len in zip(block_tables, seq_lens, query_lens, strict=True):
        for pos in range(seq_len - q_len, seq_len):
            slots.append(table[pos // block_size] * block_size + pos % block_size)
    width = max((len(t) for t in block_tables), default=1) or 1
    padded = [list(t) + [0] * (width - len(t)) for t in block_tables]
    return slots, padded


def write_kv(cache: KVCache, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Stores keys/values ([num_tokens, kv_heads, head_dim]) at their slots (PyTorch ops)."""
    reference_write_kv(cache[0], cache[1], k, v, slot_mapping)


def write_step_kv(
    cache: KVCache, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata
) -> None:
    """This step's keys/values through the kernel of the backend that built `meta`."""
    if meta.backend is None:
        write_kv(cache, k, v, meta.slot_mapping)
    else:
        meta.backend.write_kv(cache, k, v, meta)


def _attend_mask(query_pos, key_pos, seq_len, window: int | None) -> torch.Tensor:
    """True where a query may look at a key: causal, inside the sequence, inside the window."""
    mask = (key_pos <= query_pos) & (key_pos < seq_len)
    if window is not None:
        mask &= key_pos > query_pos - window
    return mask


def paged_attention(
    q: torch.Tensor, cache: KVCache, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    """q: [num_tokens, num_heads, head_dim] -> [num_tokens, num_heads, head_dim], this step's K/V
    already written to `cache`.

    Every row, prefill or decode, goes through one batch-invariant kernel: the one of the
    backend that built `meta` (models/attention_backend.py; each kernel documents the order it
    fixes), else the PyTorch key-block attention.
    """
    if meta.backend is None:
        return key_block_attention(q, cache, meta, scale)
    return meta.backend.forward(q, cache, meta, scale)


def key_block_attention(
    q: torch.Tensor, cache: KVCache, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    """The PyTorch key-block attention (models/block_attention.py) of `paged_attention`."""
    k_cache, v_cache = cache
    return block_attention(
        q, k_cache, v_cache, meta.block_plan(q.shape[1] // k_cache.shape[2]), scale
    )


def layer_attention(
    q: torch.Tensor,
    cache: KVCache,
    meta: AttentionMetadata,
    scale: float,
    window: int | None,
    softcap: float | None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """`paged_attention` for a layer with its own sliding window and tanh soft-capping of its
    scores (Gemma 2 / 3) or attention sinks ([H], gpt-oss): without a cap or sinks, through the
    backend that built `meta` when its kernel
    takes a window per call (`forward_window`: the C++ attention); otherwise the PyTorch
    key-block attention, whatever backend built `meta` (only the K/V write goes through the
    backend; the forward path keeps such models off the kernels that plan one window per
    model: models/forward_path.py)."""
    forward_window = getattr(meta.backend, "forward_window", None)
    if softcap is None and sinks is None and forward_window is not None:
        return forward_window(q, cache, meta, scale, window)
    k_cache, v_cache = cache
    plan = meta.window_plan(q.shape[1] // k_cache.shape[2], window)
    return block_attention(q, k_cache, v_cache, plan, scale, softcap, sinks)


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Plain attention for ONE sequence whose queries are its last q_len tokens; `sinks` [H]:
    one more logit per head in the softmax, with no value (gpt-oss).

    q: [q_len, num_heads, head_dim]; k, v: [seq_len, kv_heads, head_dim] (the whole context).
    Written with explicit matmul and softmax in float64, for tests only.
    """
    q_len, num_heads, _ = q.shape
    seq_len, kv_heads, _ = k.shape
    group = num_heads // kv_heads
    k = k.double().repeat_interleave(group, dim=1)  # [seq_len, H, D]
    v = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    query_pos = torch.arange(seq_len - q_len, seq_len).view(-1, 1)
    key_pos = torch.arange(seq_len).view(1, -1)
    mask = _attend_mask(query_pos, key_pos, seq_len, sliding_window)
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is not None:  # a column per head that every query sees, dropped after the softmax
        sink = sinks.double().view(-1, 1, 1).expand(num_heads, q_len, 1)
        probs = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1]
        return torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
