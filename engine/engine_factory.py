"""Building an Engine from a model path and an EngineConfig: resolve device and dtype, load
weights and tokenizer, size the KV cache from the memory budget, wire runner and scheduler.
`random_weights` (a config.json dict) builds that shape with seeded random weights instead
(models/random_weights.py; no tokenizer: token-id prompts), for benchmarks.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from engine.config import (
    EngineConfig,
    dtype_bytes,
    kv_cache_budget_bytes,
    num_kv_blocks,
    resolve_device,
    resolve_dtype_name,
    resolve_max_model_len,
)
from engine.cuda_graphs.decode_graphs import GraphSettings
from engine.memory import CPU_DEFAULT_CAP_BYTES, free_memory_bytes
from engine.model_runner import ModelRunner
from engine.scheduling.block_manager import BlockManager
from engine.scheduling.scheduler import Scheduler

log = logging.getLogger("tgserve.engine")


def build_engine(
    cls,
    model_path: str | None,
    config: EngineConfig,
    progress: bool,
    random_weights: dict[str, Any] | None = None,
):
    from models.cpu_features import native_bf16
    from models.default_model import default_model_path
    from models.loader import TORCH_DTYPE_BY_NAME, load_model
    from models.tokenizer import load_tokenizer

    device = torch.device(resolve_device(config.device, torch.cuda.is_available()))
    dtype_name = resolve_dtype_name(config.dtype, device.type, native_bf16(device))
    if random_weights is not None:
        from models.random_weights import random_model

        model, model_config = random_model(
            random_weights, TORCH_DTYPE_BY_NAME[dtype_name], device, config.seed
        )
        path = Path(model_path or "random")  # a name only: nothing is read from it
    else:
        path = Path(model_path) if model_path else default_model_path()
        model, model_config = load_model(path, dtype_name, device, progress)
    if config.quantization == "int8":
        from models.quantization import quantize_int8_weight_only

        quantize_int8_weight_only(model)
    if config.compile:
        from models.compiled_layers import compile_dense_halves

        compile_dense_halves(model)
    tokenizer = None
    try:
        if random_weights is None:
            tokenizer = load_tokenizer(path)
    except ValueError as exc:
        log.warning("no tokenizer: %s (token-id prompts still work)", exc)
    max_model_len = resolve_max_model_len(config, model_config.max_position_embeddings)
    num_blocks = _num_blocks(config, model_config, dtype_name, device, max_model_len)
    # The C++ CPU kernels are built (first run on a machine, ~1 min) or loaded here, while the
    # runner picks its forward path (models/forward_path.py), not at the first step.
    runner = ModelRunner(
        model,
        model_config,
        num_blocks,
        config.block_size,
        TORCH_DTYPE_BY_NAME[dtype_name],
        device,
        config.cpu_kernels,
        sampleable_vocab=tokenizer.vocab_size if tokenizer is not None else None,
        graphs=graph_settings(config, device, max_model_len),
    )
    scheduler = Scheduler(
        config,
        BlockManager(num_blocks, config.block_size, config.enable_prefix_caching),
        max_model_len,
    )
    eos = tuple(
        dict.fromkeys((tokenizer.eos_token_ids if tokenizer else ()) + model_config.eos_token_ids)
    )
    name = path.stem if path.is_file() else path.name
    log.info(
        "loaded %s (%s, %s on %s); KV cache: %d blocks of %d tokens = %d tokens; max_model_len %d;"
        " %s",
        name,
        model_config.architecture,
        dtype_name,
        device,
        num_blocks,
        config.block_size,
        num_blocks * config.block_size,
        max_model_len,
        runner.forward_path.description,
    )
    return cls(runner, scheduler, tokenizer, config, name, eos)


def graph_settings(
    config: EngineConfig, device: torch.device, max_model_len: int
) -> GraphSettings | None:
    """Decode CUDA graphs on CUDA unless `enforce_eager` (--enforce-eager); never on CPU."""
    if device.type != "cuda" or config.enforce_eager:
        return None
    return GraphSettings(config.max_num_seqs, max_model_len)


def _num_blocks(
    config: EngineConfig, model_config, dtype_name: str, device: torch.device, max_model_len: int
) -> int:
    budget = kv_cache_budget_bytes(config, free_memory_bytes(device))
    if config.kv_cache_memory_bytes is None and device.type == "cpu":
        budget = min(budget, CPU_DEFAULT_CAP_BYTES)
    blocks = num_kv_blocks(
        budget,
        model_config.num_layers,
        model_config.num_kv_heads,
        model_config.head_dim,
        dtype_bytes(dtype_name),
        config.block_size,
    )
    # More blocks than every running sequence at full length can use is memory wasted.
    useful = config.max_num_seqs * (-(-max_model_len // config.block_size) + 1)
    return min(blocks, useful)
