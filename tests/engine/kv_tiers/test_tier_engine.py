"""The K/V tiers behind a real engine: a prefix evicted from the pool is loaded from the RAM tier,
or after a restart from the disk tier, instead of being prefilled, and the answer is the cold
run's to the token (the CPU path restores the K/V bytes bit for bit); a damaged file is refused
and changes no output; K/V of another model is never read.

Oracle: the same greedy request on a fresh engine without tiers (its cold prefill). The hit
counters show the tier served the blocks; overwriting the tier's copy with zeros changes the
answer, so the equality is not vacuous.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.kv_tiers.config import KVTierConfig
from engine.kv_tiers.keys import chained_block_hash
from engine.requests.sampling_params import SamplingParams
from tests.checkpoints import save_checkpoint
from tests.engine.engine_fixtures import assert_no_leaks, random_prompts, tiny_engine

POOL = dict(kv_cache_memory_bytes=120_000)  # ~58 blocks of 4 tokens: the fillers evict P
PROMPT = random_prompts(1, (61, 61), seed=11)[0]  # 15 full blocks before the last token
FILLERS = random_prompts(2, (150, 150), seed=12)
GREEDY = SamplingParams(max_tokens=6, temperature=0)
BLOCKS = (len(PROMPT) - 1) // 4


def answer(engine) -> tuple[int, ...]:
    return engine.generate([PROMPT], GREEDY)[0].outputs[0].token_ids


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiers") / "llama"


@pytest.fixture(scope="module")
def cold(model) -> tuple[int, ...]:
    return answer(tiny_engine(model, **POOL))


def evicted(engine) -> None:
    """Runs P, then fillers that take the whole pool: P's blocks leave it for the tiers."""
    engine.generate(FILLERS, GREEDY)
    match = engine.scheduler.block_manager.match_prefix(PROMPT)
    assert match.block_ids == ()  # nothing of P left in the pool


def tier_engine(model, directory: Path | None, **tiers):
    disk = {"disk_dir": str(directory)} if directory is not None else {}
    return tiny_engine(model, **POOL, kv_tiers=KVTierConfig(ram_bytes=4_000_000, **disk, **tiers))


def test_a_prefix_evicted_to_ram_is_loaded_and_answers_as_cold(model, cold) -> None:
    engine = tier_engine(model, None)
    assert answer(engine) == cold
    evicted(engine)
    assert engine.stats().kv_tiers.saved_blocks >= BLOCKS
    hits_before = engine.stats().prefix_cache_hits
    assert answer(engine) == cold
    stats = engine.stats()
    assert stats.kv_tiers.ram_hits == BLOCKS and stats.kv_tiers.ram_hit_bytes > 0
    assert stats.prefix_cache_hits - hits_before == BLOCKS * 4
    assert_no_leaks(engine)
    # Not vacuous: the same hit over zeroed K/V answers differently.
    evicted(engine)
    for key in engine.scheduler.block_manager.tiers.index.ram.lru_keys():
        engine.scheduler.block_manager.tiers.index.ram.get_any(key).kv.zero_()
    assert answer(engine) != cold


def test_the_disk_tier_serves_a_new_engine_on_the_same_directory(model, cold, tmp_path) -> None:
    first = tier_engine(model, tmp_path)
    answer(first)
    evicted(first)
    first.scheduler.block_manager.tiers.index.flush()
    second = tier_engine(model, tmp_path)  # a restart: nothing in its pool or RAM
    assert answer(second) == cold
    stats = second.stats().kv_tiers
    assert stats.disk_hits == BLOCKS and stats.ram_hits == BLOCKS and stats.disk_rejected == 0
    assert_no_leaks(second)


def block_file(engine, directory: Path, index: int) -> Path:
    """The file of P's block `index` under the engine's namespace."""
    key = None
    for i in range(index + 1):
        key = chained_block_hash(key, tuple(PROMPT[i * 4 : (i + 1) * 4]))
    store = engine.scheduler.block_manager.tiers.index
    return directory / (store.namespace.file_stem(key) + ".kvb")


def test_damaged_files_are_refused_and_change_no_output(model, cold, tmp_path) -> None:
    first = tier_engine(model, tmp_path)
    answer(first)
    evicted(first)
    first.scheduler.block_manager.tiers.index.flush()
    flipped = block_file(first, tmp_path, 9)
    data = bytearray(flipped.read_bytes())
    data[-7] ^= 0x01  # one bit of K/V
    flipped.write_bytes(bytes(data))
    second = tier_engine(model, tmp_path)
    assert answer(second) == cold
    stats = second.stats().kv_tiers
    assert (stats.disk_hits, stats.ram_hits, stats.disk_rejected) == (9, 9, 1)
    assert not flipped.exists()
    cut = block_file(first, tmp_path, 3)
    cut.write_bytes(cut.read_bytes()[:-100])
    third = tier_engine(model, tmp_path)
    assert answer(third) == cold
    stats = third.stats().kv_tiers
    assert (stats.disk_hits, stats.ram_hits, stats.disk_rejected) == (3, 3, 1)


def test_another_model_never_reads_these_files(model, tmp_path) -> None:
    first = tier_engine(model, tmp_path)
    answer(first)
    evicted(first)
    first.scheduler.block_manager.tiers.index.flush()
    other_model = model.parent / "llama-other-seed"
    save_checkpoint("llama", other_model, seed=1)
    other_cold = answer(tiny_engine(other_model, **POOL))
    other = tier_engine(other_model, tmp_path)
    assert answer(other) == other_cold
    assert other.stats().kv_tiers.disk_hits == 0
    assert other.stats().kv_tiers.disk_rejected == 0  # not even opened: other file names


def test_a_closed_engine_leaves_its_pool_prefixes_on_disk(model, cold, tmp_path) -> None:
    """Never evicted, P's blocks were only in the pool: the close writes them, so a restart
    finds the whole chain (eviction takes a chain's tail first and leaves its head)."""
    first = tier_engine(model, tmp_path)
    assert answer(first) == cold
    assert first.stats().kv_tiers.saved_blocks == 0
    first.close()
    second = tier_engine(model, tmp_path)
    assert answer(second) == cold
    assert second.stats().kv_tiers.disk_hits == BLOCKS
