"""Reads a llama.cpp GGUF LoRA file (convert_lora_to_gguf's layout) into a `LoraAdapter`.

Layout: metadata `general.type = "adapter"`, `adapter.type = "lora"`, `adapter.lora.alpha`;
tensors `blk.N.<part>.weight.lora_a` [r, in] and `.lora_b` [out, r] (row-major, as
models/gguf/file.py returns them) for parts attn_q/k/v, attn_output, ffn_gate/up/down. The
scale is alpha / r (llama.cpp's rule; a file has one alpha). For the `llama` architecture
llama.cpp permutes the rows of Q and K (interleaved rotary pairs), lora_b's rows included: they
are put back in Hugging Face order here, as for a base model (models/gguf/names.py).

Contract: `load_gguf_lora(path, name, config)` returns the adapter (float32 tensors) or raises
`LoraRefused` naming the reason: not an adapter / not LoRA, no alpha, a tensor tgserve does not
apply (token_embd / output adapters, unknown parts), an unpaired tensor, shapes that do not fit.
"""

from __future__ import annotations

import re
from pathlib import Path

from models.config import ModelConfig
from models.gguf.file import open_gguf
from models.gguf.names import unpermute_rotary_rows
from models.lora.adapter import LoraAdapter, LoraRefused, ModuleLora, lora_scale

_PARTS = {
    "attn_q": "q_proj",
    "attn_k": "k_proj",
    "attn_v": "v_proj",
    "attn_output": "o_proj",
    "ffn_gate": "gate_proj",
    "ffn_up": "up_proj",
    "ffn_down": "down_proj",
}
_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.weight\.lora_([ab])")
_PERMUTED_ARCHS = {"llama"}  # architectures whose Q/K rows llama.cpp interleaves


def load_gguf_lora(path: str | Path, name: str, config: ModelConfig) -> LoraAdapter:
    try:
        gguf = open_gguf(path)
    except (OSError, ValueError) as exc:
        raise LoraRefused(f"adapter {name!r}: unreadable GGUF file: {exc}") from exc
    meta = gguf.metadata
    if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
        raise LoraRefused(
            f"adapter {name!r}: {Path(path).name} is not a GGUF LoRA adapter (general.type "
            f"{meta.get('general.type')!r}, adapter.type {meta.get('adapter.type')!r})"
        )
    alpha = meta.get("adapter.lora.alpha")
    if alpha is None:
        raise LoraRefused(f"adapter {name!r}: the GGUF file has no adapter.lora.alpha")
    pairs: dict[tuple[int, str], dict[str, object]] = {}
    for info in gguf.infos:
        m = _NAME.fullmatch(info.name)
        if m is None or m[2] not in _PARTS:
            raise LoraRefused(
                f"adapter {name!r}: tensor {info.name!r} is not one tgserve applies (LoRA on "
                f"{', '.join(_PARTS)} of the blocks only)"
            )
        pairs.setdefault((int(m[1]), _PARTS[m[2]]), {})[m[3]] = gguf.tensor(info).float()
    permuted = gguf.architecture in _PERMUTED_ARCHS
    heads = {"q_proj": config.num_heads, "k_proj": config.num_kv_heads}
    modules: dict[tuple[int, str], ModuleLora] = {}
    for (layer, module), ab in sorted(pairs.items()):
        if set(ab) != {"a", "b"}:
            raise LoraRefused(f"adapter {name!r}: blk.{layer} {module} lacks lora_a or lora_b")
        a, b = ab["a"], ab["b"]
        if permuted and module in heads and b.shape[0] % (2 * heads[module]) == 0:
            b = unpermute_rotary_rows(b, heads[module])
        modules[(layer, module)] = ModuleLora(a=a, b=b, scale=lora_scale(alpha, a.shape[0], False))
    if not modules:
        raise LoraRefused(f"adapter {name!r}: the GGUF file holds no LoRA tensors")
    adapter = LoraAdapter(name=name, modules=modules)
    adapter.check_fits(config)
    return adapter
