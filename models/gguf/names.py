"""GGUF tensor names and layouts -> Hugging Face names and layouts.

Contract: `gguf_to_hf_tensors(gguf, hf_config)` yields `(gguf_name, hf_name, tensor)` for every tensor of
the file, named exactly as transformers' state_dict names them, in transformers' layout:
- llama (also Mistral): llama.cpp permutes the rows of the Q and K projections (weight and
  bias) so that rotary pairs are interleaved (its "normal" rope); the permutation is undone here.
  qwen2 and qwen3 GGUFs use NeoX rope and are stored unpermuted.
- gpt2: llama.cpp stores Conv1D weights transposed to [out, in]; they go back to HF's [in, out].
- mixture-of-experts: the router `ffn_gate_inp`, the shared expert `ffn_*_shexp` (its gate
  `ffn_gate_inp_shexp` [hidden] -> [1, hidden]) and the experts' 3-D `ffn_{gate,up,down}_exps`
  [E, rows, cols], yielded expert by expert under the files' per-expert names.
- gemma2, gemma3, phi3: their own block names and Gemma's norm fixup
  (models/gguf/dense_families.py).
- gpt-oss: its own names and expert layouts, MXFP4 experts kept as blocks
  (models/gpt_oss/gguf.py); it has no per-tensor plan (`gguf_to_hf_plan` refuses it).
- `rope_freqs.weight` (and Phi-3's LongRoPE factors) are not weights: they become config
  (models/gguf/config.py) and are skipped.
A tensor name we do not know raises `ValueError` naming the file and the tensor.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from models.gguf.dense_families import BLOCK_NAMES, CONFIG_TENSORS, FIXUPS
from models.gguf.file import GGUFFile
from models.gguf.header import GGUFTensorInfo
from models.gpt_oss.gguf import ARCH as GPT_OSS
from models.gpt_oss.gguf import gpt_oss_tensors

_LLAMA_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LLAMA_BLOCK = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm",  # qwen3
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate_inp": "mlp.gate",  # mixture-of-experts: the router (Mixtral: block_sparse_moe.gate)
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",  # qwen2moe's shared expert and its gate
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
# The experts' 3-D tensors [E, rows, cols]: one plan entry (a row of dim 0) per expert, under
# the files' per-expert names (Qwen's projections; Mixtral's w1 / w3 / w2).
_EXPERT_PARTS = {"ffn_gate_exps": ("gate_proj", "w1"), "ffn_up_exps": ("up_proj", "w3"),
                 "ffn_down_exps": ("down_proj", "w2")}  # fmt: skip
_GPT2_GLOBAL = {
    "token_embd.weight": "transformer.wte.weight",
    "position_embd.weight": "transformer.wpe.weight",
    "output_norm.weight": "transformer.ln_f.weight",
    "output_norm.bias": "transformer.ln_f.bias",
    "output.weight": "lm_head.weight",
}
_GPT2_BLOCK = {
    "attn_norm": "ln_1",
    "attn_qkv": "attn.c_attn",
    "attn_output": "attn.c_proj",
    "ffn_norm": "ln_2",
    "ffn_up": "mlp.c_fc",
    "ffn_down": "mlp.c_proj",
}
# GPT-2 Conv1D weights: transposed back to [in, out].
_GPT2_TRANSPOSED = {"attn_qkv", "attn_output", "ffn_up", "ffn_down"}
_SKIPPED = {"rope_freqs.weight", *CONFIG_TENSORS}
_BLOCK_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")

Fixup = Callable[[torch.Tensor], torch.Tensor]


def unpermute_rotary_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undoes llama.cpp's Q/K row permutation.

    Within each head, HF orders the rotary rows as [first half | second half] (pairs (i, i+d/2));
    llama.cpp stores them interleaved (pairs (2i, 2i+1)). Stored row order per head is
    (d/2, 2) flattened; HF's is (2, d/2). Works for a weight [n_heads*d, in] or a bias [n_heads*d].
    """
    rows = w.shape[0]
    half = rows // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape).contiguous()


def _hf_name_and_fixup(gguf_name: str, arch: str, cfg: dict[str, Any]) -> tuple[str, Fixup | None]:
    if arch == "gpt2":
        table, blocks, prefix = _GPT2_GLOBAL, _GPT2_BLOCK, "transformer.h"
    else:
        table, prefix = _LLAMA_GLOBAL, "model.layers"
        blocks = BLOCK_NAMES.get(arch, _LLAMA_BLOCK)
    family_fixup = FIXUPS.get(arch, lambda part: None)
    if gguf_name in table:
        return table[gguf_name], family_fixup(gguf_name.split(".")[0])
    m = _BLOCK_NAME.fullmatch(gguf_name)
    if m is None or m.group(2) not in blocks:
        raise KeyError(gguf_name)
    layer, part, kind = m.groups()
    name = f"{prefix}.{layer}.{blocks[part]}.{kind}"
    if cfg.get("model_type") == "mixtral":
        name = name.replace(".mlp.gate.", ".block_sparse_moe.gate.")
    if part == "ffn_gate_inp_shexp":  # llama.cpp stores the shared expert's gate as [hidden]
        return name, lambda w: w.reshape(1, -1)
    fixup: Fixup | None = family_fixup(part)
    if arch == "gpt2" and part in _GPT2_TRANSPOSED and kind == "weight":
        fixup = _transpose
    elif arch == "llama" and part in ("attn_q", "attn_k"):
        heads = cfg["num_attention_heads"] if part == "attn_q" else cfg["num_key_value_heads"]
        fixup = _rotary_fixup(heads)
    return name, fixup


def _transpose(w: torch.Tensor) -> torch.Tensor:
    return w.t().contiguous()


def _rotary_fixup(n_heads: int) -> Fixup:
    return lambda w: unpermute_rotary_rows(w, n_heads)


def gguf_to_hf_tensors(
    gguf: GGUFFile, hf_config: dict[str, Any]
) -> Iterator[tuple[str, str, torch.Tensor]]:
    """Yields (gguf_name, hf_name, tensor), checking every name and type before any work."""
    if gguf.architecture == GPT_OSS:
        yield from gpt_oss_tensors(gguf)
        return
    for info, hf_name, tensor in plan_tensors(gguf, gguf_to_hf_plan(gguf, hf_config)):
        yield info.name, hf_name, tensor


def plan_tensors(
    gguf: GGUFFile, plan: Iterable[tuple[GGUFTensorInfo, str, Fixup | None]]
) -> Iterator[tuple[GGUFTensorInfo, str, torch.Tensor]]:
    """(info, hf_name, tensor dequantised and fixed up) for the entries of a plan. An expert
    tensor's entries follow each other: it is read (dequantised) once for all of them."""
    last: tuple[GGUFTensorInfo | None, torch.Tensor | None] = (None, None)
    for info, hf_name, fixup in plan:
        tensor = last[1] if last[0] is info else gguf.tensor(info)
        last = (info, tensor)
        yield info, hf_name, fixup(tensor) if fixup else tensor


def _expert_entries(
    info: GGUFTensorInfo, cfg: dict[str, Any]
) -> list[tuple[GGUFTensorInfo, str, Fixup | None]] | None:
    """One entry per expert of an experts' 3-D tensor (its expert's [rows, cols], cloned so the
    tensor it came from can be freed), None for any other tensor."""
    m = _BLOCK_NAME.fullmatch(info.name)
    if m is None or m.group(2) not in _EXPERT_PARTS:
        return None
    layer, part, _ = m.groups()
    qwen, mixtral = _EXPERT_PARTS[part]
    if cfg.get("model_type") == "mixtral":
        stem, proj = f"model.layers.{layer}.block_sparse_moe.experts", mixtral
    else:
        stem, proj = f"model.layers.{layer}.mlp.experts", qwen
    return [(info, f"{stem}.{e}.{proj}.weight", _expert_row(e)) for e in range(info.shape[0])]


def _expert_row(e: int) -> Fixup:
    return lambda w: w[e].clone()


def gguf_to_hf_plan(
    gguf: GGUFFile, hf_config: dict[str, Any]
) -> list[tuple[GGUFTensorInfo, str, Fixup | None]]:
    """(info, hf_name, fixup of the rows or None) for every tensor, names and types checked.
    A fixup only moves or transposes rows, so it applies to a quantised matrix's block rows too
    (a Q/K unpermute; GPT-2's transpose does not: it needs the values)."""
    arch = gguf.architecture
    if arch == GPT_OSS:
        raise ValueError(f"{gguf.path}: a gpt-oss GGUF is read whole (gguf_to_hf_tensors)")
    gguf.check_types()
    plan = []
    for info in gguf.infos:
        if info.name in _SKIPPED:
            continue
        experts = _expert_entries(info, hf_config)
        if experts is not None:
            plan += experts
            continue
        try:
            plan.append((info, *_hf_name_and_fixup(info.name, arch, hf_config)))
        except KeyError:
            raise ValueError(
                f"{gguf.path}: tensor {info.name!r} is not one tgserve knows for GGUF "
                f"architecture {arch!r}"
            ) from None
    return plan
