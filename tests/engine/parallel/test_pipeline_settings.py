"""Pipeline parallel refuses, before any process starts, what it cannot serve: each ValueError
names the setting (hand-written cases): a size below 1, LoRA adapters (their bank spans every
layer), K/V tiers (whole blocks), quantized or compiled layers, a model family other than the
Llama kin, more stages than layers; TP x PP is the group's size."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig
from engine.kv_tiers.config import KVTierConfig
from engine.lora_config import LoraConfig
from models.config import ModelConfig
from models.parallel.stages import check_pipeline_parallel

LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 320,
    "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
}  # fmt: skip
GPT2 = {
    "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 320, "n_embd": 64,
    "n_layer": 2, "n_head": 4, "n_positions": 256,
}  # fmt: skip


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"pipeline_parallel_size": 0}, "pipeline_parallel_size must be a positive integer"),
        ({"pipeline_parallel_size": 2, "lora": LoraConfig()}, "LoRA adapters need pipeline"),
        ({"pipeline_parallel_size": 2, "kv_tiers": KVTierConfig(ram_bytes=1 << 20)}, "tiers"),
        ({"pipeline_parallel_size": 2, "quantization": "int8"}, "pipeline_parallel_size > 1"),
        ({"pipeline_parallel_size": 2, "compile": True}, "pipeline_parallel_size > 1"),
    ],
)
def test_settings_pipeline_parallel_cannot_serve_are_refused(values, named) -> None:
    with pytest.raises(ValueError, match=named):
        EngineConfig(**values)


def test_the_group_is_tensor_times_pipeline_ranks() -> None:
    config = EngineConfig(tensor_parallel_size=2, pipeline_parallel_size=3)
    assert config.parallel_world_size == 6


def test_other_families_and_more_stages_than_layers_are_refused() -> None:
    check_pipeline_parallel(ModelConfig.from_hf_dict(LLAMA), 2)
    with pytest.raises(ValueError, match="larger than the model's 2 layers"):
        check_pipeline_parallel(ModelConfig.from_hf_dict(LLAMA), 3)
    with pytest.raises(ValueError, match="pipeline_parallel_size 1"):
        check_pipeline_parallel(ModelConfig.from_hf_dict(GPT2), 2)
