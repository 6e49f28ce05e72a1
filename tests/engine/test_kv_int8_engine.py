"""`--kv-cache-dtype int8` (and `float16`, models/kv_half.py, and `int8v`: float16 K rows, int8
V rows) behind a real engine (tiny seeded Llama, 2 layers, 2 KV heads, head_dim 16, block 4,
float32 model):

- the pool holds the tokens its bytes allow: a block is 2 * 2 layers * 4 tokens * 2 heads *
  (16 + 4) bytes = 640 against float32's 2 * 2 * 4 * 2 * 16 * 4 = 2048 (3.2x the blocks here;
  3.76x for the default model's head_dim 64), a float16 one 2 * 2 * 4 * 2 * 16 * 2 = 1024 (2x),
  an int8v one 2 * 4 * 2 * (16 * 2 + 16 + 4) = 832 (2.46x; 2.61x at head_dim 64), counted by
  the block manager;
- a request's greedy answer is its solo run's whatever else shares the pool with it: beside other
  requests, preempted and recomputed, or over a prefix cached by an earlier request;
- the K/V tiers move int8 (float16) blocks as they move float32 ones (a prefix evicted to the
  RAM tier answers as the cold run), and never hand a float32 cache's blocks to an int8 (float16)
  engine, nor an older int8 row layout's (the tier key holds the K/V dtype and the int8 layout's
  version), nor int8v blocks to a float16 engine (the key names K's and V's dtypes);
- what cannot serve int8 K/V says so: fp8 on a CPU, no C++ kernels, encoder-decoder models,
  a model whose attention is the PyTorch key-block one (Gemma 2's capped scores).
Oracles: hand-computed block counts; the same request alone on a fresh int8 engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.kv_tiers.config import KVTierConfig
from engine.requests.sampling_params import SamplingParams
from models import kv_quant
from tests.encdec_checkpoints import save_encdec_checkpoint
from tests.engine.engine_fixtures import (
    assert_no_leaks,
    random_prompts,
    run_beside_a_long_request,
    tiny_engine,
)
from tests.family_checkpoints import save_family_checkpoint

pytestmark = pytest.mark.cpu_kernels  # the C++ attention reads the int8 rows: CPU only

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
INT8 = dict(kv_cache_dtype="int8")
BLOCK_BYTES = {"int8": 640, "float16": 1024, "int8v": 832}  # a block's K/V, by hand (module doc)
FLOAT32_BLOCK = 2048


@pytest.fixture(scope="module", params=list(BLOCK_BYTES))
def kind(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kv_int8") / "llama"


@pytest.fixture(scope="module")
def alone(model, kind):
    """Runs one request at a time, nothing cached: each request's solo answer."""
    return tiny_engine(model, enable_prefix_caching=False, kv_cache_dtype=kind)


def solo(engine, prompt: list[int], params: SamplingParams = GREEDY) -> tuple[int, ...]:
    return engine.generate([prompt], params)[0].outputs[0].token_ids


def test_the_pool_counts_its_blocks_and_answers_do_not_depend_on_the_batch(
    model, kind, alone
) -> None:
    prompts = random_prompts(4, (9, 30), seed=3)
    prompts.append(prompts[0] + random_prompts(1, (7, 7), seed=4)[0])  # shares prompt 0's prefix
    want = [solo(alone, p) for p in prompts]
    budget = 200_000
    engine = tiny_engine(model, kv_cache_memory_bytes=budget, kv_cache_dtype=kind)
    # the pool's own count: 312 blocks of 640 bytes (195 of 1024), where float32's are 97
    assert engine.scheduler.block_manager.num_blocks == budget // BLOCK_BYTES[kind]
    got = [out.outputs[0].token_ids for out in engine.generate(prompts[:4], GREEDY)]
    assert got == want[:4]
    hits = engine.stats().prefix_cache_hits
    assert engine.generate([prompts[4]], GREEDY)[0].outputs[0].token_ids == want[4]
    assert engine.stats().prefix_cache_hits > hits  # it did read the cached int8 / fp16 blocks
    assert_no_leaks(engine)


def test_a_preempted_request_answers_as_alone(model, kind, alone, monkeypatch) -> None:
    prompt = random_prompts(1, (11, 11), seed=6)[0]
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)

    def same_blocks(folder, kv_cache_memory_bytes, **config):
        # the helper sizes its pool in float32 blocks (2048 bytes): as many of this kind
        blocks = kv_cache_memory_bytes // FLOAT32_BLOCK
        budget = blocks * BLOCK_BYTES[kind]
        return tiny_engine(folder, kv_cache_memory_bytes=budget, **config, kv_cache_dtype=kind)

    monkeypatch.setattr("tests.engine.engine_fixtures.tiny_engine", same_blocks)
    final, preemptions, engine = run_beside_a_long_request(model, "r", prompt, params, seed=7)
    assert preemptions > 0
    assert final.outputs[0].token_ids == solo(alone, prompt, params)
    assert_no_leaks(engine)


def test_blocks_go_through_the_ram_tier_and_only_to_engines_of_their_kind(
    model, kind, tmp_path, monkeypatch
) -> None:
    prompt = random_prompts(1, (61, 61), seed=11)[0]
    fillers = random_prompts(2, (150, 150), seed=12)
    pool = dict(kv_cache_memory_bytes=58 * BLOCK_BYTES[kind], kv_cache_dtype=kind)  # evicts P
    cold = tiny_engine(model, **pool).generate([prompt], GREEDY)[0].outputs[0].token_ids
    tiers = KVTierConfig(ram_bytes=4_000_000, disk_dir=str(tmp_path))
    engine = tiny_engine(model, **pool, kv_tiers=tiers)
    engine.generate([prompt], GREEDY)
    engine.generate(fillers, GREEDY)
    assert engine.scheduler.block_manager.match_prefix(prompt).block_ids == ()
    assert engine.generate([prompt], GREEDY)[0].outputs[0].token_ids == cold
    assert engine.stats().kv_tiers.ram_hits == (len(prompt) - 1) // 4
    engine.scheduler.block_manager.tiers.index.flush()
    again = tiny_engine(model, **pool, kv_tiers=KVTierConfig(disk_dir=str(tmp_path)))
    assert again.generate([prompt], GREEDY)[0].outputs[0].token_ids == cold
    assert again.stats().kv_tiers.disk_hits > 0  # a restarted engine of this kind reads them
    # a float32 engine on the same directory finds none of them (the key holds the K/V dtype)
    other = tiny_engine(
        model, kv_cache_memory_bytes=58 * 2048, kv_tiers=KVTierConfig(disk_dir=str(tmp_path))
    )
    other.generate([prompt], GREEDY)
    assert other.stats().kv_tiers.disk_hits == 0
    if kind == "int8v":  # nor a float16 engine, whose K rows are int8v's K rows' dtype
        half = tiny_engine(
            model,
            kv_cache_memory_bytes=58 * 1024,
            kv_cache_dtype="float16",
            kv_tiers=KVTierConfig(disk_dir=str(tmp_path)),
        )
        half.generate([prompt], GREEDY)
        assert half.stats().kv_tiers.disk_hits == 0
    if kind != "int8":
        return
    # nor does an int8 engine of another row layout (the key holds the layout's version)
    monkeypatch.setattr(kv_quant, "LAYOUT", "int8-rows-v1")
    older = tiny_engine(model, **pool, kv_tiers=KVTierConfig(disk_dir=str(tmp_path)))
    older.generate([prompt], GREEDY)
    assert older.stats().kv_tiers.disk_hits == 0


@pytest.mark.parametrize(
    "config,message",
    [
        (dict(kv_cache_dtype="fp8"), "fp8 is for CUDA devices; on a CPU use --kv-cache-dtype int8"),
        (dict(cpu_kernels=False, **INT8), "--disable-cpu-kernels turns off"),
    ],
)
def test_what_cannot_read_int8_rows_refuses_them(model, config, message) -> None:
    with pytest.raises(ValueError, match=message):
        tiny_engine(model, **config)


def test_models_without_the_cpp_attention_refuse_int8(tmp_path) -> None:
    bart = save_encdec_checkpoint("bart", tmp_path / "bart")
    with pytest.raises(ValueError, match="encoder-decoder models"):
        tiny_engine(bart, **INT8)
    gemma2 = save_family_checkpoint("gemma2", tmp_path / "gemma2")
    with pytest.raises(ValueError, match="cannot read it: use --kv-cache-dtype auto"):
        tiny_engine(gemma2, **INT8)


def test_the_option_is_validated() -> None:
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, int8, fp8"):
        EngineConfig(kv_cache_dtype="int4")
