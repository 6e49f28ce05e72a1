"""Beam search, structured outputs and speculative decoding keep working under a LoRA adapter
(the tiny Llama with its BPE tokenizer, float32). Oracles: the same engine on peft's
`merge_and_unload()` of the adapter, run without adapters (beam search, a grammar), and the
adapter's own run without speculation (n-gram proposals and a draft model that drafts without
the adapter: the adapter's model verifies, so the tokens are unchanged)."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.lora_config import LoraConfig
from engine.requests.sampling_params import SamplingParams
from engine.requests.structured_output import StructuredOutput
from engine.speculative.config import SpeculativeConfig
from tests.engine.engine_fixtures import run_staggered
from tests.models.lora.peft_adapters import make_peft_adapter

pytestmark = pytest.mark.cpu_kernels


@pytest.fixture(scope="module")
def folders(tiny_model_folder, tmp_path_factory):
    import transformers

    base = transformers.LlamaForCausalLM.from_pretrained(tiny_model_folder, dtype=torch.float32)
    root = tmp_path_factory.mktemp("lora_features")
    peft = make_peft_adapter(base.eval(), root / "ad", seed=50)
    peft.merge_and_unload().save_pretrained(root / "merged")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model_folder / name, root / "merged" / name)
    return tiny_model_folder, root


def engine(folder, **config) -> Engine:
    common = dict(dtype="float32", kv_cache_memory_bytes=4_000_000, block_size=4)
    return Engine.from_model(str(folder), EngineConfig(**common, **config))


def with_adapter(folders, **config) -> Engine:
    base, root = folders
    return engine(base, lora=LoraConfig(adapters=(("ad", str(root / "ad")),)), **config)


def outputs(eng: Engine, prompt, params: SamplingParams) -> list[tuple[int, ...]]:
    final = run_staggered(eng, [prompt], [params])[0]
    return [tuple(o.token_ids) for o in final.outputs]


PROMPT = list(range(40, 52))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=8, temperature=0.0, use_beam_search=True, n=2, best_of=3),
        SamplingParams(
            max_tokens=12,
            temperature=0.0,
            structured_output=StructuredOutput("regex", r"[a-z ]{4,30}"),
        ),
    ],
    ids=["beam", "grammar"],
)
def test_adapter_equals_the_merged_model(folders, params) -> None:
    adapted = outputs(with_adapter(folders), PROMPT, dataclasses.replace(params, adapter="ad"))
    merged = outputs(engine(folders[1] / "merged"), PROMPT, params)
    assert adapted == merged


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_speculation_keeps_the_adapters_tokens(folders, method) -> None:
    base, _ = folders
    prompt = PROMPT + PROMPT[:6] + PROMPT  # repeats: n-gram proposals to verify
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, adapter="ad")
    spec = SpeculativeConfig(
        method=method, num_tokens=3, model=str(base) if method == "draft" else None
    )
    plain = outputs(with_adapter(folders), prompt, params)
    speculated = with_adapter(folders, speculative=spec)
    assert outputs(speculated, prompt, params) == plain
    assert speculated.stats().speculation.num_proposed_tokens > 0
