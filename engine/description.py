"""EngineDescription: what a loaded engine runs and holds, for reports (the benchmark's labels
and memory figures, a start-up log), read through `Engine.describe()` and never through the
runner or the model behind it.

Contract: `describe_runner(runner)` reads a built `ModelRunner` once and returns a frozen
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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.model_runner import ModelRunner


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


def describe_runner(runner: ModelRunner) -> EngineDescription:
    from models.activation_quant import Q8Linear
    from models.block_linear import BlockEmbedding, BlockLinear

    model, config = runner.model, runner.config
    blocks = [
        m.block_weight for m in model.modules() if isinstance(m, BlockLinear | BlockEmbedding)
    ]
    blocks += [m.q8_weight for m in model.modules() if isinstance(m, Q8Linear)]  # int8 activations
    storages: dict[int, int] = {}
    for t in (*model.parameters(), *model.buffers()):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    for w in blocks:
        storages[w.packed.data_ptr()] = w.nbytes
    k0 = runner.kv_caches[0][0]  # [num_blocks, block_size, kv_heads, head_dim]
    kv_bytes = sum(k.nbytes + v.nbytes for k, v in runner.kv_caches)
    held = {"weights": sum(storages.values()), "KV cache": kv_bytes}
    # K and V per layer for every query head of the whole model (not this rank's shard).
    no_gqa_bytes = 2 * config.num_layers * config.num_heads * config.head_dim * k0.element_size()
    packed = getattr(runner.forward_path, "packed_bytes", 0)  # only the C++ step packs copies
    if packed:
        held["packed copies"] = packed
    return EngineDescription(
        forward_path=runner.forward_path.description,
        cpu_kernels=runner.forward_path.attention_kernel,
        cuda_graphs=runner.decode_graphs is not None and runner.device.type == "cuda",
        gguf_blocks_as_stored=bool(blocks),
        held_bytes=MappingProxyType(held),
        kv_cache_itemsize=k0.element_size(),
        kv_bytes_per_token=kv_bytes // (k0.shape[0] * k0.shape[1]),
        kv_bytes_per_token_all_heads=no_gqa_bytes,
    )
