"""The shard layout splits by whole KV-head groups (unevenly when it must), replicates KV
heads when there are more ranks than KV heads, and refuses, saying why, what cannot be
split: every query head lands on exactly one rank, next to the KV head it reads."""

from __future__ import annotations

import pytest

from models.config import ModelConfig
from models.parallel import check_tensor_parallel, plan_shards


def _config(heads: int, kv_heads: int, family: str = "llama", vocab: int = 49152) -> ModelConfig:
    return ModelConfig(
        architecture="LlamaForCausalLM" if family == "llama" else "GPT2LMHeadModel",
        family=family,
        vocab_size=vocab,
        hidden_size=64 * heads,
        intermediate_size=1536,
        num_layers=2,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=64,
        max_position_embeddings=2048,
    )


def test_smollm2_at_tp2_is_split_two_kv_heads_and_one() -> None:
    config = _config(9, 3)  # SmolLM2-135M: 9 query heads, 3 KV heads
    first, second = (plan_shards(config, 2, r) for r in range(2))
    assert (first.kv_heads, first.heads) == ((0, 2), (0, 6))
    assert (second.kv_heads, second.heads) == ((2, 3), (6, 9))
    assert (first.intermediate, second.intermediate) == ((0, 768), (768, 1536))
    assert (first.vocab, second.vocab) == ((0, 24576), (24576, 49152))


@pytest.mark.parametrize(
    ("heads", "kv_heads", "world"),
    [
        (9, 3, 2),
        (9, 3, 3),
        (9, 3, 6),
        (9, 3, 9),
        (6, 2, 2),
        (6, 2, 4),
        (8, 8, 3),
        (32, 8, 16),
        (4, 1, 2),
        (4, 1, 4),
        (12, 4, 8),
    ],
)
def test_every_query_head_is_on_one_rank_with_the_kv_head_it_reads(heads, kv_heads, world):
    config = _config(heads, kv_heads, vocab=1000)
    group = heads // kv_heads
    layouts = [plan_shards(config, world, r) for r in range(world)]
    owners = [r for r, lay in enumerate(layouts) for _ in range(*lay.heads)]
    assert sorted(h for lay in layouts for h in range(*lay.heads)) == list(range(heads))
    assert len(owners) == heads
    for lay in layouts:
        assert lay.num_heads >= 1 and lay.num_kv_heads >= 1
        assert all(lay.kv_heads[0] <= h // group < lay.kv_heads[1] for h in range(*lay.heads))
        # GQA on the shard: the local query heads split evenly over the local KV heads.
        assert lay.num_heads % lay.num_kv_heads == 0
    for name, total in (("intermediate", config.intermediate_size), ("vocab", 1000)):
        ranges = [getattr(lay, name) for lay in layouts]
        bounds = [lo for lo, _ in ranges] + [ranges[-1][1]]
        assert bounds[0] == 0 and bounds[-1] == total
        assert all(hi == lo for (_, hi), (lo, _) in zip(ranges[:-1], ranges[1:], strict=True))
        sizes = [hi - lo for lo, hi in ranges]
        assert max(sizes) - min(sizes) <= 1
    assert layouts[0].vocab_shard_width == max(hi - lo for lo, hi in (x.vocab for x in layouts))


@pytest.mark.parametrize(
    ("heads", "kv_heads", "world", "why"),
    [
        (9, 3, 4, "multiple of 3"),  # 4 ranks over 3 KV heads: neither split nor replicate
        (9, 3, 12, "at most 9 ranks"),  # each KV head on 4 ranks, but only 3 heads read it
        (4, 1, 8, "at most 4 ranks"),
    ],
)
def test_splits_that_cannot_be_made_are_refused_saying_why(heads, kv_heads, world, why):
    with pytest.raises(ValueError, match=why):
        check_tensor_parallel(_config(heads, kv_heads), world)


def test_gpt2_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="GPT2LMHeadModel runs with tensor_parallel_size 1"):
        check_tensor_parallel(_config(4, 4, family="gpt2"), 2)
