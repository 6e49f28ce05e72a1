"""Adapters tgserve cannot apply are refused with the reason: DoRA, modules_to_save, embedding
and LM-head adapters (folders written by peft itself), an unknown target module, a base-model
mismatch (another hidden size, more layers), a rank above the bank's max, not a folder."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from models.config import ModelConfig
from models.lora import LoraBank, LoraRefused, load_peft_folder
from tests.checkpoints import make_hf_model
from tests.models.lora.peft_adapters import make_peft_adapter


@pytest.fixture(scope="module")
def hf():
    return make_hf_model("llama")


def config_of(hf_model) -> ModelConfig:
    return ModelConfig.from_hf_dict(hf_model.config.to_dict())


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        ({"use_dora": True}, "DoRA"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"target_modules": ["q_proj", "embed_tokens"]}, "embedding adapters"),
        ({"target_modules": ["v_proj", "lm_head"]}, "LM-head adapters"),
        ({"bias": "lora_only"}, "trained biases"),
    ],
)
def test_peft_folders_asking_for_more_are_refused(hf, tmp_path, kwargs, reason) -> None:
    make_peft_adapter(hf, tmp_path, seed=1, **kwargs)
    with pytest.raises(LoraRefused, match=reason):
        load_peft_folder(tmp_path, "x", config_of(hf))


def write_folder(folder, tensors: dict[str, torch.Tensor], **config) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, **config}
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    save_file(tensors, str(folder / "adapter_model.safetensors"))


def pair(name: str, k: int, n: int, r: int = 2) -> dict[str, torch.Tensor]:
    prefix = f"base_model.model.model.layers.{name}"
    return {
        f"{prefix}.lora_A.weight": torch.ones(r, k),
        f"{prefix}.lora_B.weight": torch.ones(n, r),
    }


def test_unknown_target_module_is_named(hf, tmp_path) -> None:
    write_folder(tmp_path, pair("0.mlp.fc1", 96, 112))
    with pytest.raises(LoraRefused, match="unknown target module 'model.layers.0.mlp.fc1'"):
        load_peft_folder(tmp_path, "x", config_of(hf))


@pytest.mark.parametrize(
    "tensors, reason",
    [
        (pair("0.self_attn.q_proj", 64, 64), "maps 64 -> 64 features.*96 -> 96"),
        (pair("7.mlp.down_proj", 112, 96), "layer 7 of down_proj is past the base model's 2"),
        ({**pair("0.self_attn.q_proj", 96, 96, r=3)}, "rank 3 in its tensors but 2"),
    ],
)
def test_base_model_mismatch_is_refused(hf, tmp_path, tensors, reason) -> None:
    write_folder(tmp_path, tensors)
    with pytest.raises(LoraRefused, match=reason):
        load_peft_folder(tmp_path, "x", config_of(hf))


def test_rank_above_the_bank_is_refused(hf, tmp_path) -> None:
    write_folder(tmp_path, pair("1.self_attn.v_proj", 96, 32, r=16), r=16)
    adapter = load_peft_folder(tmp_path, "big", config_of(hf))
    bank = LoraBank(config_of(hf), slots=1, max_rank=8, dtype=torch.float32, device="cpu")
    with pytest.raises(LoraRefused, match="rank 16, above --max-lora-rank 8"):
        bank.write(0, adapter)


def test_not_a_folder(hf, tmp_path) -> None:
    with pytest.raises(LoraRefused, match="not a PEFT LoRA folder"):
        load_peft_folder(tmp_path / "missing", "x", config_of(hf))
