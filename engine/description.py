"""EngineDescription: what a loaded engine runs and holds, for reports (the benchmark's labels
and memory figures, a start-up log), read through `Engine.describe()` and never through the
runner or the model behind it.

Contract: `describe_runner(model, config, kv_caches, path, cuda_graphs, packed_bytes)` (what a
runner's `describe()` passes: its model and the whole model's config, its KV cache, its forward path's report, whether decode steps
replay captured graphs, the bytes of packed weight copies) returns a frozen
`EngineDescription`; nothing is measured by running (no step, no allocation). Held bytes count
each storage once (tied weights, shared GGUF blocks): the model's weights (parameters, buffers
and GGUF blocks kept as stored), the KV cache tensors as allocated (the CUDA-graph scratch block
included), and the packed weight copies the forward path made (the C++ step's, see
models/cpu_kernels/fused_decoder.py; absent when it made none). Bytes per token: the cache's
bytes over its token slots, and beside them what the whole model's cache would take if it
repeated the KV heads for every query head (the GQA saving).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class EngineDescription:
    forward_path: str  # how steps run, e.g. "forward steps by tgserve's C++ CPU kernels"
    cpu_kernels: bool  # tgserve's C++ CPU kernels serve the forward (the whole step or attention)
    cuda_graphs: bool  # decode steps replay captured CUDA graphs (engine/cuda_graphs)
    gguf_blocks_as_stored: bool  # some weights stay GGUF blocks (models/block_linear.py)
    held_bytes: Mapping[str, int]  # "weights", "KV cache", and "packed copies" when there are any
    kv_cache_itemsize: int  # bytes per K or V element in the cache
    kv_bytes_per_token: int  # K and V of one token, all layers: cache bytes / token slots
    # What a cache repeating the KV heads for every query head (no GQA) would take per token.
    kv_bytes_per_token_all_heads: int


def describe_runner(
    model: Any, config: Any, kv_caches: list, path: Any, cuda_graphs: bool, packed_bytes: int
) -> EngineDescription:
    """`model`: a torch module; `config`: its models.config.ModelConfig; `kv_caches`: per
    layer (K, V) tensors; `path`: has `description` and `attention_kernel`."""
    from models.activation_quant import Q8Linear
    from models.block_linear import BlockEmbedding, BlockLinear

    blocks = [
        m.block_weight for m in model.modules() if isinstance(m, BlockLinear | BlockEmbedding)
    ]
    blocks += [m.q8_weight for m in model.modules() if isinstance(m, Q8Linear)]  # int8 activations
    storages: dict[int, int] = {}
    for t in (*model.parameters(), *model.buffers()):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    for w in blocks:
        storages[w.packed.data_ptr()] = w.nbytes
    k0 = kv_caches[0][0]  # [num_blocks, block_size, kv_heads, head_dim]
    kv_bytes = sum(k.nbytes + v.nbytes for k, v in kv_caches)
    held = {"weights": sum(storages.values()), "KV cache": kv_bytes}
    # K and V per layer for every query head of the whole model (not this rank's shard).
    no_gqa_bytes = 2 * config.num_layers * config.num_heads * config.head_dim * k0.element_size()
    if packed_bytes:
        held["packed copies"] = packed_bytes
    return EngineDescription(
        forward_path=path.description,
        cpu_kernels=path.attention_kernel,
        cuda_graphs=cuda_graphs,
        gguf_blocks_as_stored=bool(blocks),
        held_bytes=MappingProxyType(held),
        kv_cache_itemsize=k0.element_size(),
        kv_bytes_per_token=kv_bytes // (k0.shape[0] * k0.shape[1]),
        kv_bytes_per_token_all_heads=no_gqa_bytes,
    )
