"""Loading a GGUF with its block-quantised matrices kept as stored (the default for GGUF files).

Contract: `load_stored_gguf(path, dtype, device)` returns `(model, config)` for a Llama-family
or mixture-of-experts GGUF (its experts' 3-D tensors as stored: models/moe/stored_experts.py) on a CPU with tgserve's C++ kernels built, or None (the caller then dequantises as
before) when the file is another family, the device is not a CPU, the kernels are unavailable,
or no matrix is stored in a type of `STORED_TYPES`.
- Every linear layer and the token embedding whose matrices are all of one type of
  `STORED_TYPES` becomes a `BlockLinear` / `BlockEmbedding` (models/block_linear.py) holding
  the file's blocks: q/k/v (and gate/up) concatenated by rows as llama.py fuses them, llama.cpp's
  Q/K row permutation undone on the block rows (a block never spans two rows). With tied
  embeddings the LM head is a `BlockLinear` over the embedding's blocks (one copy).
- A fused layer whose parts have different types (Q4_K_M: Q6_K attn_v beside Q4_K q / k) is
  one mixed `BlockWeight` when every part's type is in `MIXABLE_TYPES` (the K-quants, Q5_0 /
  Q5_1); otherwise it, and every other tensor (norms, biases, F16 / BF16 / F32 matrices), loads
  as the dequantising path loads it, in `dtype`.
- Memory: the model is built on the meta device and the block layers are put in before the
  rest is allocated, so no dense matrix is made for a block layer; each tensor's bytes are read
  (not memory-mapped: no file page stays mapped) and freed once packed, and the freed heap pages
  are handed back. Resident weight bytes after load ≈ the file's tensor bytes.
Errors: `ValueError` naming the file and tensor for a shape the model does not expect.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from gguf import GGMLQuantizationType
from torch import nn

from models import cpu_kernels
from models.block_linear import (
    MIXABLE_TYPES,
    STORED_TYPES,
    BlockEmbedding,
    BlockLinear,
    BlockWeight,
)
from models.config import ModelConfig
from models.gguf.config import read_gguf_config
from models.gguf.file import GGUFFile
from models.gguf.header import GGUFTensorInfo
from models.gguf.names import Fixup, gguf_to_hf_plan, plan_tensors
from models.host_memory import release_freed_memory
from models.moe.stored_experts import keep_experts_as_stored, stored_expert_groups

# Hugging Face module fragment -> (our fused module fragment, part index, parts).
_FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0, 3),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1, 3),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2, 3),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0, 2),
    "mlp.up_proj": ("mlp.gate_up_proj", 1, 2),
    "mlp.shared_expert.gate_proj": ("mlp.shared_expert.gate_up_proj", 0, 2),  # Qwen2-MoE
    "mlp.shared_expert.up_proj": ("mlp.shared_expert.gate_up_proj", 1, 2),
}

# The families whose GGUFs load as stored: Llama's, and its mixture-of-experts kin (models/moe).
_FAMILIES = ("llama", "moe")

Part = tuple[int, GGUFTensorInfo, str, Fixup | None]  # (part index, info, hf name, fixup)
_TRIM_EVERY = 16 << 20  # bytes packed between trims of freed heap memory


def load_stored_gguf(
    path: Path, dtype: torch.dtype, device: str | torch.device
) -> tuple[nn.Module, ModelConfig] | None:
    from models import build_meta_model, materialise

    if torch.device(device).type != "cpu" or cpu_kernels.extension() is None:
        return None
    gguf, hf_config, config = read_gguf_config(path)
    if config.family not in _FAMILIES:
        return None
    plan = gguf_to_hf_plan(gguf, hf_config)
    groups = _block_groups(plan)
    if not groups and not stored_expert_groups(plan):
        return None
    # Built on the meta device: the block layers go in before anything is allocated, so no
    # dense matrix is ever made for a layer the file stores as blocks.
    model = build_meta_model(config, dtype)
    kept: set[str] = set()
    packed_since_trim = 0
    for module_name, (parts, count) in groups.items():
        types = {_qtype(info) for _, info, _, _ in parts}
        if len(parts) == count and (len(types) == 1 or types <= MIXABLE_TYPES):
            weight = _pack(gguf, sorted(parts, key=lambda p: p[0]))
            _replace(model, module_name, weight, dtype, path)
            kept.update(hf_name for _, _, hf_name, _ in parts)
            # Each pack frees its raw reads; glibc keeps freed heap blocks resident until a
            # trim, so the load's peak would grow with the file (host_memory.py). Trimming every
            # _TRIM_EVERY bytes bounds the peak's excess over the packed bytes by about that.
            packed_since_trim += weight.nbytes
            if packed_since_trim >= _TRIM_EVERY:
                release_freed_memory()
                packed_since_trim = 0
    kept |= keep_experts_as_stored(model, gguf, plan)  # mixture-of-experts: models/moe
    if config.tie_word_embeddings and isinstance(model.model.embed_tokens, BlockEmbedding):
        model.lm_head = BlockLinear(model.model.embed_tokens.block_weight)
    model = materialise(model, config, device)  # the dense rest: norms, other matrices, rotary
    with torch.no_grad():
        model.load_weights(_rest(gguf, plan, kept))
    release_freed_memory()  # the raw bytes read per tensor, freed after packing
    return model, config


def stores_blocks(path: Path) -> bool:
    """Whether `load_stored_gguf` keeps some of this file's matrices as stored on a CPU with the
    kernels: a Llama-family GGUF with at least one matrix in a type of `STORED_TYPES` (read
    from the file's header and tensor table; nothing is loaded). False for other files."""
    path = Path(path)
    if not path.is_file() or path.suffix.lower() != ".gguf":
        return False
    gguf, hf_config, config = read_gguf_config(path)
    if config.family not in _FAMILIES:
        return False
    plan = gguf_to_hf_plan(gguf, hf_config)
    return bool(_block_groups(plan) or stored_expert_groups(plan))


def _qtype(info: GGUFTensorInfo) -> GGMLQuantizationType | None:
    try:
        return GGMLQuantizationType(info.type_id)
    except ValueError:
        return None


def _block_groups(plan) -> dict[str, tuple[list[Part], int]]:
    """Our module name -> (its parts stored in a block type, how many parts it has)."""
    groups: dict[str, tuple[list[Part], int]] = {}
    for info, hf_name, fixup in plan:
        if (
            len(info.shape) != 2
            or _qtype(info) not in STORED_TYPES
            or not hf_name.endswith(".weight")
        ):
            continue
        module, index, count = hf_name.removesuffix(".weight"), 0, 1
        for fragment, (fused, part, parts) in _FUSED.items():
            if module.endswith(f".{fragment}"):
                module, index, count = module.removesuffix(fragment) + fused, part, parts
        groups.setdefault(module, ([], count))[0].append((index, info, hf_name, fixup))
    return groups


def _pack(gguf: GGUFFile, parts: list[Part]) -> BlockWeight:
    rows = [
        (fixup(gguf.blocks(info)) if fixup else gguf.blocks(info), _qtype(info))
        for _, info, _, fixup in parts
    ]
    return BlockWeight.pack_parts(rows, parts[0][1].shape[-1])


def _replace(
    model: nn.Module, name: str, weight: BlockWeight, dtype: torch.dtype, path: Path
) -> None:
    old = model.get_submodule(name)
    if isinstance(old, nn.Embedding):
        want, new = (old.num_embeddings, old.embedding_dim), BlockEmbedding(weight, dtype)
    else:
        want, new = (old.out_features, old.in_features), BlockLinear(weight, old.bias)
    got = (weight.out_features, weight.in_features)
    if got != want:
        raise ValueError(
            f"{path}: the matrices of {name!r} have shape {got}, the model expects {want}"
        )
    model.set_submodule(name, new)


def _rest(gguf: GGUFFile, plan, kept: set[str]) -> Iterator[tuple[str, torch.Tensor]]:
    rest = [entry for entry in plan if entry[1] not in kept]
    for _, hf_name, tensor in plan_tensors(gguf, rest):
        yield hf_name, tensor
