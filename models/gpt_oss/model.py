"""gpt-oss (GptOssForCausalLM): Llama's pre-norm decoder with q/k/v/o biases, attention sinks
(a learned logit per head in every softmax denominator), sliding-window (128) and full layers
alternating (`layer_types`), YaRN rope (models/rotary.py) and a sparse MLP in every layer
(models/gpt_oss/experts.py).

Contract: as `LlamaForCausalLM` (models/llama.py): `forward`, `compute_logits`, and
`load_weights` over transformers' names (`self_attn.sinks`, `mlp.router.{weight,bias}`,
`mlp.experts.gate_up_proj` [E, H, 2I], `..._bias` [E, 2I], `mlp.experts.down_proj` [E, I, H],
`..._bias` [E, H]); the released MXFP4 expert tensors arrive as `Mxfp4Pair`s
(models/loader.py, models/gpt_oss/mxfp4.py), dequantised here one projection at a time. Each
layer attends with its own window and its sinks through `models.attention.layer_attention`: the
PyTorch key-block attention (the C++ and Triton attentions take no sinks: `plain_attention`
and `kernel_attention` keep the family on its own forward, every step eager,
models/forward_path.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from models.attention import AttentionMetadata, KVCache, layer_attention
from models.config import ModelConfig
from models.gemma import GemmaAttention
from models.gpt_oss.experts import GptOssMoeBlock
from models.gpt_oss.mxfp4 import Mxfp4Pair
from models.llama import LlamaForCausalLM

# transformers' grouped expert tensors: (projection, "" for the weight or "_bias").
_EXPERTS = re.compile(r"\.mlp\.experts\.(gate_up_proj|down_proj)(_bias)?$")


class GptOssAttention(GemmaAttention):
    """Gemma's attention with its own window (biases on q/k/v/o, scale 1 / sqrt(head_dim), no
    cap, no q/k norms for a gpt-oss config) and the sinks [H] in every softmax."""

    def __init__(self, config: ModelConfig, window: int | None) -> None:
        super().__init__(config, window)
        self.sinks = nn.Parameter(torch.empty(config.num_heads), requires_grad=False)  # [H]

    def attention(self, q: torch.Tensor, cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        return layer_attention(q, cache, meta, self.scale, self.window, None, self.sinks)


class GptOssForCausalLM(LlamaForCausalLM):
    plain_attention = True  # sinks and per-layer windows: no Triton path, no C++ step
    kernel_attention = False  # nor the C++ attention (it has no sinks)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)  # on the meta device (models.build_meta_model): no memory
        if len(config.layer_windows) != config.num_layers:
            raise ValueError("a gpt-oss config needs one window entry per layer (layer_windows)")
        for index, layer in enumerate(self.model.layers):
            layer.self_attn = GptOssAttention(config, config.layer_windows[index])
            layer.mlp = GptOssMoeBlock(config)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.weight_loader().load(_grouped_expert_params(weights))


def _grouped_expert_params(
    weights: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """transformers' [E, K, N] expert matrices as our [E * N, K] weights (and [E, N] biases
    flat), under `mlp.experts.{gate_up,down}_proj.{weight,bias}`; other names pass."""
    for name, tensor in weights:
        match = _EXPERTS.search(name)
        if match is None:
            yield name, tensor
            continue
        proj, bias = match.groups()
        if isinstance(tensor, Mxfp4Pair):  # the released checkpoints' experts
            tensor = tensor.dense()
        stem = name[: match.start()] + f".mlp.experts.{proj}"
        if bias:
            yield stem + ".bias", tensor.reshape(-1)
        else:
            yield stem + ".weight", tensor.transpose(1, 2).reshape(-1, tensor.shape[1])
