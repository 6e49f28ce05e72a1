"""Sharding a loaded Llama-family model in place for one tensor-parallel rank.

Contract: `shard_model(model, layout, group)` takes a model loaded from the one set of model
files (every rank reads the same files) and keeps only the rank's part (models/parallel/
layout.py): qkv and gate-up become column shards (plain nn.Linear with the rank's rows), o
and down become `RowParallelLinear` (the rank's input columns, one all-reduce each), the
embedding a `VocabParallelEmbedding`, the LM head a `ParallelLMHead` (tied to the embedding
shard when the model ties them). The attention modules learn their local head counts. The
full tensors are dropped as each layer is cut, so a rank ends up holding about 1/N of the
linear weights (the norms and rotary tables are replicated).
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

from models.gpt_oss.experts import GptOssMoeBlock
from models.gpt_oss.parallel import shard_gpt_oss_block
from models.moe.block import SparseMoeBlock
from models.moe.parallel import shard_sparse_block
from models.parallel.group import ParallelGroup
from models.parallel.layers import ParallelLMHead, RowParallelLinear, VocabParallelEmbedding
from models.parallel.layout import Range, ShardLayout

L = TypeVar("L", bound=nn.Linear)


def shard_model(model: nn.Module, layout: ShardLayout, group: ParallelGroup) -> nn.Module:
    c = model.config
    inner = model.model
    for layer in inner.layers:
        _shard_attention(layer.self_attn, layout, group, c.head_dim)
        if isinstance(layer.mlp, GptOssMoeBlock):  # gpt-oss: models/gpt_oss/experts.py
            shard_gpt_oss_block(layer.mlp, layout.world, layout.rank, group)
        elif isinstance(layer.mlp, SparseMoeBlock):  # mixture of experts: models/moe/parallel.py
            shard_sparse_block(layer.mlp, layout.world, layout.rank, group,
                               lambda mlp, columns: _shard_mlp(mlp, layout, group, columns))  # fmt: skip
        else:
            _shard_mlp(layer.mlp, layout, group)
    lo, hi = layout.vocab
    embedding = VocabParallelEmbedding(_rows(inner.embed_tokens.weight, lo, hi), (lo, hi), group)
    head_weight = (
        embedding.weight
        if c.tie_word_embeddings
        else nn.Parameter(_rows(model.lm_head.weight, lo, hi), requires_grad=False)
    )
    inner.embed_tokens = embedding
    model.lm_head = ParallelLMHead(head_weight, c.vocab_size, layout.vocab_shard_width, group)
    model.tie_weights = lambda: None  # the shards are tied above; nothing to re-tie
    return model


def _shard_attention(attn: nn.Module, layout: ShardLayout, group: ParallelGroup, d: int) -> None:
    (h0, h1), (k0, k1) = layout.heads, layout.kv_heads
    q_size, kv_size = attn.q_size, attn.kv_size
    qkv = attn.qkv_proj
    # Fused rows [q | k | v]: keep this rank's query heads, then its KV heads' k and v rows.
    keep = torch.cat(
        (
            torch.arange(h0 * d, h1 * d),
            torch.arange(q_size + k0 * d, q_size + k1 * d),
            torch.arange(q_size + kv_size + k0 * d, q_size + kv_size + k1 * d),
        )
    )
    attn.qkv_proj = _linear(qkv.weight[keep], None if qkv.bias is None else qkv.bias[keep])
    o = attn.o_proj  # [hidden, q]: the columns of this rank's query heads
    attn.o_proj = _row_parallel(o.weight[:, h0 * d : h1 * d], o.bias, layout, group)
    if getattr(attn, "sinks", None) is not None:  # gpt-oss: one sink logit per query head
        attn.sinks = nn.Parameter(attn.sinks.detach()[h0:h1].clone(), requires_grad=False)
    attn.num_heads, attn.num_kv_heads = h1 - h0, k1 - k0
    attn.q_size, attn.kv_size = (h1 - h0) * d, (k1 - k0) * d


def _shard_mlp(
    mlp: nn.Module, layout: ShardLayout, group: ParallelGroup, columns: Range | None = None
) -> None:
    """`columns`: the intermediate range to keep (default the layout's, the dense MLP's)."""
    lo, hi = columns or layout.intermediate
    full = mlp.intermediate
    w = mlp.gate_up_proj.weight  # [2 * intermediate, hidden]: gate rows, then up rows
    mlp.gate_up_proj = _linear(torch.cat((w[lo:hi], w[full + lo : full + hi])), None)
    down = mlp.down_proj  # [hidden, intermediate]
    mlp.down_proj = _row_parallel(down.weight[:, lo:hi], down.bias, layout, group)
    mlp.intermediate = hi - lo


def _rows(weight: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    return weight.detach()[lo:hi].clone()


def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    return _fill(layer, weight, bias)


def _row_parallel(
    weight: torch.Tensor, bias: torch.Tensor | None, layout: ShardLayout, group: ParallelGroup
) -> RowParallelLinear:
    bias = bias if layout.rank == 0 else None  # added once, after the sum would double it
    layer = RowParallelLinear(
        weight.shape[1], weight.shape[0], bias=bias is not None, device="meta"
    )
    layer.group = group
    return _fill(layer, weight, bias)


def _fill(layer: L, weight: torch.Tensor, bias: torch.Tensor | None) -> L:
    layer.weight = nn.Parameter(weight.detach().contiguous().clone(), requires_grad=False)
    if bias is not None:
        layer.bias = nn.Parameter(bias.detach().clone(), requires_grad=False)
    return layer
