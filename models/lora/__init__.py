"""LoRA adapters: loading (PEFT folders: peft_folder.py; llama.cpp GGUF LoRA files:
gguf_file.py), refusals naming the reason (adapter.py), the bank of adapter slots on the
model's device (bank.py) and the batched shrink / expand applying each row's adapter to a
projection (stack.py; the C++ kernel models/cpu_kernels/lora.cpp).

Contract: `load_adapter(path, name, config)` -> `LoraAdapter` or `LoraRefused`; a
`LoraBank` attached to a Llama-family model adds, in every forward, each row's adapter (the
step's `AttentionMetadata.lora_rows`) to q/k/v/o/gate/up/down. Nothing here imports peft or
transformers.
"""

from pathlib import Path

from models.config import ModelConfig
from models.lora.adapter import LoraAdapter, LoraRefused, ModuleLora
from models.lora.bank import LoraBank
from models.lora.peft_folder import load_peft_folder

__all__ = [
    "LoraAdapter",
    "LoraBank",
    "LoraRefused",
    "ModuleLora",
    "load_adapter",
    "load_peft_folder",
]


def load_adapter(path: str | Path, name: str, config: ModelConfig) -> LoraAdapter:
    """A PEFT folder, or a llama.cpp GGUF LoRA file (a path ending in .gguf)."""
    if str(path).endswith(".gguf"):
        from models.lora.gguf_file import load_gguf_lora

        return load_gguf_lora(path, name, config)
    return load_peft_folder(path, name, config)
