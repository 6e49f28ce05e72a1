"""LoraConfig: the LoRA adapters an engine serves and the bank that holds them.

Contract: frozen, checked at construction (ValueError naming the setting):
- `adapters`: (name, path) pairs loaded at start (`--lora NAME=PATH`, repeatable): a PEFT
  folder or a llama.cpp GGUF LoRA file; names unique, non-empty, no '/' or whitespace;
- `max_loras`: slots of the bank (adapters resident at once, each its own bytes once); None:
  as many as `adapters` (at least 1). More adapters than slots may be registered: a request
  for one that holds no slot loads it into the least recently used slot no request uses
  (engine/lora_adapters.py);
- `max_lora_rank`: the largest rank a slot holds (a higher-rank adapter is refused);
- `runtime_updates`: whether `POST /v1/load_lora_adapter` / `/v1/unload_lora_adapter` may
  change the set while serving (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING).
`EngineConfig.lora` None: no bank, no adapter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NAME = re.compile(r"^[^\s/]+$")


@dataclass(frozen=True)
class LoraConfig:
    adapters: tuple[tuple[str, str], ...] = ()
    max_loras: int | None = None
    max_lora_rank: int = 16
    runtime_updates: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "adapters", tuple(tuple(pair) for pair in self.adapters))
        names = [name for name, _ in self.adapters]
        for name in names:
            if not _NAME.match(name):
                raise ValueError(f"LoRA adapter name {name!r}: non-empty, no '/' or whitespace")
        if len(set(names)) != len(names):
            raise ValueError(f"LoRA adapter names must be unique, got {names}")
        for what, value in (("max_loras", self.max_loras), ("max_lora_rank", self.max_lora_rank)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{what} must be a positive integer, got {value!r}")

    @property
    def slots(self) -> int:
        return self.max_loras or max(1, len(self.adapters))


def parse_lora_flag(value: str) -> tuple[str, str]:
    """`--lora NAME=PATH` -> (name, path); ValueError with an example otherwise."""
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"--lora takes NAME=PATH (e.g. --lora sql=/adapters/sql), got {value!r}")
    return name, path
