"""Which part of a Llama-family model each tensor-parallel rank holds (Megatron-style).

Contract: `plan_shards(config, world, rank)` returns a frozen `ShardLayout` of half-open
ranges; `check_tensor_parallel(config, world)` raises ValueError, saying why, for a split it
refuses. The rules:
- attention is split by whole KV-head groups (a KV head and the query heads that read it stay
  on one rank), as evenly as the counts allow: 3 KV heads over 2 ranks is 2 + 1, so a rank
  may hold more heads than another (SmolLM2-135M: 9 query / 3 KV heads serves at TP=2);
- with more ranks than KV heads, each KV head is replicated on `world / num_kv_heads` ranks
  (which must divide) and its group's query heads are split between them (at least one each);
- the MLP's intermediate columns and the vocabulary rows are split in near-equal contiguous
  ranges (the first ranks take one more when they do not divide).
"""

from __future__ import annotations

from dataclasses import dataclass

from models.config import ModelConfig

Range = tuple[int, int]  # [start, end)


@dataclass(frozen=True)
class ShardLayout:
    rank: int
    world: int
    heads: Range  # query heads
    kv_heads: Range  # KV heads (a replicated KV head: the same range on several ranks)
    intermediate: Range  # MLP columns (gate and up rows, down columns)
    vocab: Range  # embedding and LM head rows
    vocab_shard_width: int  # the widest rank's vocabulary rows (logits are gathered at this)

    @property
    def num_heads(self) -> int:
        return self.heads[1] - self.heads[0]

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads[1] - self.kv_heads[0]


def even_split(total: int, world: int, rank: int) -> Range:
    """Contiguous near-equal parts: the first `total % world` ranks get one more."""
    base, extra = divmod(total, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def check_tensor_parallel(config: ModelConfig, world: int) -> None:
    if world < 1:
        raise ValueError(f"tensor_parallel_size must be at least 1, got {world}")
    if world == 1:
        return
    if config.family not in ("llama", "moe", "gpt_oss"):
        raise ValueError(
            f"tensor parallel runs the Llama family (Llama, Mistral, Qwen2/3, SmolLM2) and its "
            f"mixture-of-experts kin (Mixtral, Qwen3-MoE, Qwen2-MoE, gpt-oss); "
            f"{config.architecture} runs with tensor_parallel_size 1"
        )
    kvh, heads = config.num_kv_heads, config.num_heads
    group = heads // kvh
    if world > kvh:
        if world % kvh:
            raise ValueError(
                f"tensor_parallel_size {world} cannot split {kvh} KV heads: with more ranks "
                f"than KV heads each KV head is replicated, so the size must be a multiple of "
                f"{kvh} (or at most {kvh})"
            )
        if group < world // kvh:
            raise ValueError(
                f"tensor_parallel_size {world} cannot split this model: each KV head would be "
                f"shared by {world // kvh} ranks but only {group} query heads read it; use at "
                f"most {kvh * group} ranks"
            )
    moe = config.moe
    narrowest = min(config.intermediate_size, moe.expert_intermediate_size if moe else world)
    if narrowest < world or config.vocab_size < world:
        raise ValueError(f"tensor_parallel_size {world} is larger than the model's layers")


def plan_shards(config: ModelConfig, world: int, rank: int) -> ShardLayout:
    check_tensor_parallel(config, world)
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside a tensor-parallel group of {world}")
    kvh, heads = config.num_kv_heads, config.num_heads
    group = heads // kvh
    if world <= kvh:
        kv_heads = even_split(kvh, world, rank)
        q_heads = (kv_heads[0] * group, kv_heads[1] * group)
    else:
        replicas = world // kvh
        kv = rank // replicas
        kv_heads = (kv, kv + 1)
        part = even_split(group, replicas, rank % replicas)
        q_heads = (kv * group + part[0], kv * group + part[1])
    return ShardLayout(
        rank=rank,
        world=world,
        heads=q_heads,
        kv_heads=kv_heads,
        intermediate=even_split(config.intermediate_size, world, rank),
        vocab=even_split(config.vocab_size, world, rank),
        vocab_shard_width=-(-config.vocab_size // world),
    )
