"""Random LoRA adapters made with peft (the test oracle) on the tiny checkpoints of
tests/checkpoints.py, saved as PEFT folders, and tgserve models with a LoRA bank over them.

peft initialises lora_B to zero (an adapter that changes nothing); `make_peft_adapter` fills
every lora_B with seeded noise so each adapter moves the logits."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from models import build_model
from models.config import ModelConfig
from models.lora.bank import LoraBank
from models.lora.peft_folder import load_peft_folder

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def make_peft_adapter(hf_model, folder: Path, seed: int, **lora_kwargs):
    """A peft model over a copy of `hf_model` with a random adapter, saved into `folder`."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    settings = {"r": 4, "lora_alpha": 8, "target_modules": list(ALL_TARGETS), **lora_kwargs}
    peft_model = get_peft_model(copy.deepcopy(hf_model), LoraConfig(**settings))
    gen = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
    peft_model.eval()
    peft_model.save_pretrained(str(folder))
    return peft_model


def ours_with_bank(
    hf_model, slots: int = 4, max_rank: int = 8, dtype: torch.dtype = torch.float32
) -> tuple[torch.nn.Module, LoraBank]:
    config = ModelConfig.from_hf_dict(hf_model.config.to_dict())
    model = build_model(config, dtype, "cpu")
    model.load_weights(hf_model.state_dict().items())
    bank = LoraBank(config, slots, max_rank, dtype, "cpu")
    bank.attach(model)
    return model, bank


def load_into(bank: LoraBank, slot: int, folder: Path, name: str = "a") -> None:
    bank.write(slot, load_peft_folder(folder, name, bank.config))
