"""The K/V tiers with LoRA adapters: the same prompt under two adapters and the base model never
hits another's tier blocks, and each answers its cold run's tokens; the prompt under the adapter
that wrote them hits them, in RAM and, after a restart, on disk; a different adapter loaded
under the same name after a restart never hits them.

Oracle: the same greedy requests on an engine without prefix caching or tiers (cold prefills).
The hit counters show which blocks came from a tier.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.kv_tiers.config import KVTierConfig
from engine.lora_config import LoraConfig
from engine.requests.sampling_params import SamplingParams
from tests.checkpoints import make_hf_model, save_checkpoint
from tests.engine.engine_fixtures import assert_no_leaks, random_prompts, tiny_engine
from tests.models.lora.peft_adapters import make_peft_adapter

pytestmark = pytest.mark.cpu_kernels

POOL = dict(kv_cache_memory_bytes=120_000)  # ~58 blocks of 4 tokens: the fillers evict P
PROMPT = random_prompts(1, (61, 61), seed=21)[0]  # 15 full blocks before the last token
FILLERS = random_prompts(2, (150, 150), seed=22)
BLOCKS = (len(PROMPT) - 1) // 4


def greedy(adapter: str | None) -> SamplingParams:
    return SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, adapter=adapter)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tier_lora")
    save_checkpoint("llama", root / "base")
    hf = make_hf_model("llama")
    for i, name in enumerate(("a", "b")):
        make_peft_adapter(hf, root / name, seed=50 + i)
    return root


def lora(folder: Path, a: str = "a") -> LoraConfig:
    """Adapter 'a' from folder `a`, adapter 'b' from folder b."""
    return LoraConfig(adapters=(("a", str(folder / a)), ("b", str(folder / "b"))), max_loras=2)


def answer(engine, adapter: str | None) -> tuple[int, ...]:
    return engine.generate([PROMPT], greedy(adapter))[0].outputs[0].token_ids


@pytest.fixture(scope="module")
def cold(folder) -> dict[str | None, tuple[int, ...]]:
    engine = tiny_engine(folder / "base", **POOL, enable_prefix_caching=False, lora=lora(folder))
    out = {name: answer(engine, name) for name in (None, "a", "b")}
    assert len(set(out.values())) == 3  # the adapters change the answer: a cross hit would show
    return out


def tier_engine(folder: Path, directory: Path, a: str = "a"):
    tiers = KVTierConfig(ram_bytes=4_000_000, disk_dir=str(directory))
    return tiny_engine(folder / "base", **POOL, kv_tiers=tiers, lora=lora(folder, a))


def evict(engine) -> None:
    engine.generate(FILLERS, greedy(None))


def test_tier_hits_never_cross_adapters_and_survive_a_restart(folder, cold, tmp_path) -> None:
    engine = tier_engine(folder, tmp_path)
    assert answer(engine, "a") == cold["a"]
    evict(engine)  # a's blocks leave the pool for the tiers
    for name in ("b", None):  # same tokens, other adapters: no hit on a's blocks
        assert answer(engine, name) == cold[name]
        stats = engine.stats().kv_tiers
        assert (stats.ram_hits, stats.disk_hits) == (0, 0), name
    assert answer(engine, "a") == cold["a"]
    assert engine.stats().kv_tiers.ram_hits == BLOCKS
    assert_no_leaks(engine)
    engine.close()  # writes the pool's prefixes (a, b, base) to disk
    restarted = tier_engine(folder, tmp_path)
    assert answer(restarted, "a") == cold["a"]
    assert restarted.stats().kv_tiers.disk_hits == BLOCKS
    restarted.close()
    # 'a' now names b's weights: a's blocks on disk are another adapter's K/V.
    renamed = tier_engine(folder, tmp_path, a="b")
    assert answer(renamed, "a") == cold["b"]
    assert renamed.stats().kv_tiers.disk_hits == 0
    assert answer(renamed, "b") == cold["b"]  # b's own blocks, under b's (same) weights
    assert renamed.stats().kv_tiers.disk_hits == BLOCKS
