"""Model registry: family name -> model class, and `build_model`.

Contract: `build_model(config, dtype, device)` returns a module with
`forward(input_ids[T], positions[T], meta, kv_caches) -> hidden[T, H]`,
`compute_logits(hidden[R, H]) -> [R, V]` float32 and `load_weights(pairs)`; its parameters
are allocated in `dtype`, uninitialised (never written, so not yet resident on a CPU), for
`load_weights` to fill. `build_meta_model(config, dtype)` is the same model on the meta device
(no memory): a loader may swap modules (models/gguf/stored.py puts GGUF block layers in place
of linears) before `materialise(model, config, device)` allocates what is left.
"""

from __future__ import annotations

import torch
from torch import nn

from models.config import ModelConfig
from models.encdec.bart import BartForConditionalGeneration
from models.encdec.t5 import T5ForConditionalGeneration
from models.gemma import GemmaForCausalLM
from models.gpt2 import GPT2LMHeadModel
from models.gpt_oss.model import GptOssForCausalLM
from models.kv_quant import cache_row_shape, cache_torch_dtype, part_dtypes
from models.linear_backend import pin_mkl_code_path, pin_onednn_isa
from models.llama import LlamaForCausalLM
from models.moe.model import MoeForCausalLM

pin_mkl_code_path()  # before any GEMM: MKL reads it once (models/linear_backend.py)
pin_onednn_isa()  # likewise oneDNN's ISA cap (AMX CPUs: bf16 batch invariance)

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "llama": LlamaForCausalLM,
    "gemma": GemmaForCausalLM,  # Gemma 2 / 3
    "gpt2": GPT2LMHeadModel,
    "t5": T5ForConditionalGeneration,  # encoder-decoders: models/encdec
    "bart": BartForConditionalGeneration,
    "moe": MoeForCausalLM,  # Mixtral, Qwen3-MoE, Qwen2-MoE: models/moe
    "gpt_oss": GptOssForCausalLM,  # models/gpt_oss
}


def build_model(config: ModelConfig, dtype: torch.dtype, device: torch.device | str) -> nn.Module:
    """An uninitialised model of the config's family (weights come from load_weights)."""
    return materialise(build_meta_model(config, dtype), config, device)


def build_meta_model(config: ModelConfig, dtype: torch.dtype) -> nn.Module:
    """The model on the meta device, its floating tensors already in `dtype`: no memory."""
    cls = MODEL_REGISTRY.get(config.family)
    if cls is None:
        raise ValueError(f"no model class for family {config.family!r}")
    with torch.device("meta"):
        model = cls(config)
    # Cast while on meta: materialising in float32 and casting would write a float32 copy.
    return model.to(dtype)


def materialise(model: nn.Module, config: ModelConfig, device: torch.device | str) -> nn.Module:
    """Allocates the meta model's parameters and buffers on `device`, skipping random init:
    the memory stays untouched until load_weights copies into it. Shared (tied) parameters
    stay shared. Why not `Module.to_empty`: its `empty_like` of a meta tensor runs torch's
    Python reference, which imports sympy and torch.fx (~130 MiB resident)."""
    made: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(meta) -> (meta, allocated)

    def allocate(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in made:  # the meta tensor is kept in `made`: its id is not reused
            new = torch.empty(t.shape, dtype=t.dtype, device=device)
            if isinstance(t, nn.Parameter):
                new = nn.Parameter(new, requires_grad=t.requires_grad)
            made[id(t)] = (t, new)
        return made[id(t)][1]

    for module in model.modules():
        for name, tensor in [
            *module.named_parameters(recurse=False),
            *module.named_buffers(recurse=False),
        ]:
            setattr(module, name, allocate(tensor))
    model.tie_weights()
    _reset_buffers(model, config)
    return model.eval()


def _reset_buffers(model: nn.Module, config: ModelConfig) -> None:
    """Buffers computed in __init__ (rotary tables) were lost on the meta device: recompute."""
    from models.rotary import RotaryEmbedding

    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            module.reset()


def allocate_kv_cache(
    config: ModelConfig,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device | str,
    num_kv_heads: int | None = None,
    kv_cache_dtype: str = "auto",
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (k, v), each [num_blocks, block_size, num_kv_heads, head_dim] of `dtype`; a
    tensor-parallel rank passes the KV heads it holds (default: the model's). `kv_cache_dtype`
    "int8": int8 rows with their scales, [..., head_dim + 4] (models/kv_quant.py); "int8v":
    float16 K [..., head_dim], int8 V rows [..., head_dim + 4]."""
    heads = config.num_kv_heads if num_kv_heads is None else num_kv_heads
    parts = [
        ((num_blocks, block_size, heads, cache_row_shape(config.head_dim, part)),
         cache_torch_dtype(dtype, part))
        for part in part_dtypes(kv_cache_dtype)
    ]  # fmt: skip
    return [
        tuple(torch.zeros(shape, dtype=part, device=device) for shape, part in parts)
        for _ in range(config.num_layers)
    ]


__all__ = [
    "MODEL_REGISTRY",
    "ModelConfig",
    "allocate_kv_cache",
    "build_meta_model",
    "build_model",
    "materialise",
]
