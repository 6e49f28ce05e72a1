"""The parallel sizes of one replica, checked: what EngineConfig's `tensor_parallel_size` and
`pipeline_parallel_size` may be, alone and with the other settings. Torch-free.

Contract: `check_parallel_sizes(config)` raises ValueError naming the setting for
- a size that is not a positive integer;
- K/V tiers (kv_offload_*) with more than one rank: a tier moves whole KV blocks, which a
  tensor-parallel rank (some KV heads) or a pipeline stage (some layers) does not hold;
- quantized or compiled layers with more than one rank (models/parallel cuts dense layers);
- LoRA adapters with pipeline_parallel_size > 1 (the adapters' bank spans every layer).
The world of a replica is tensor_parallel_size x pipeline_parallel_size ranks, numbered
stage-major (models/parallel/pipe.py).
"""

from __future__ import annotations

from typing import Any


def check_parallel_sizes(config: Any) -> None:
    """`config`: an EngineConfig (its other fields already checked)."""
    tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
    for name, value, hint in (
        ("tensor_parallel_size", tp, "1 runs in one process"),
        ("pipeline_parallel_size", pp, "1 runs every layer in each rank"),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}; {hint}")
    if config.kv_tiers is not None and tp > 1:
        raise ValueError("kv_offload_* tiers need tensor_parallel_size 1 (whole KV blocks)")
    if config.kv_tiers is not None and pp > 1:
        raise ValueError("kv_offload_* tiers need pipeline_parallel_size 1 (whole KV blocks)")
    # "auto" activations stay float under tensor / pipeline parallel (engine/activation_choice)
    quantized = config.quantization or config.activation_quantization in ("int8", "int16")
    if tp > 1 and (quantized or config.compile):
        raise ValueError(
            "tensor_parallel_size > 1 runs unquantized, uncompiled layers; drop "
            "quantization / activation_quantization / compile, or use tensor_parallel_size 1"
        )
    if pp > 1 and (quantized or config.compile):
        raise ValueError(
            "pipeline_parallel_size > 1 runs unquantized, uncompiled layers; drop "
            "quantization / activation_quantization / compile, or use pipeline_parallel_size 1"
        )
    if pp > 1 and config.lora is not None:
        raise ValueError(
            "LoRA adapters need pipeline_parallel_size 1 (the adapters' bank spans every layer); "
            "use tensor_parallel_size to split the model instead"
        )
