"""Building any rank's runner (engine/runner.py: a ModelRunner, or for T5 / BART an
EncoderDecoderRunner) from a model path and an EngineConfig: resolve device and
dtype, load (or randomly initialise) the weights, shard them under tensor parallel, quantise or
compile them when asked, size the KV cache from the memory budget, and pick decode graphs.

Contract: `build_runner(path, config, progress, group, sampleable_vocab, workers,
random_weights)` returns a `BuiltRunner` (the runner, the model's config, the dtype name, the
context length, the number of KV blocks and the activation quantization it runs: "auto" resolved
by engine/activation_choice.py). Under tensor parallel (`group`), every rank calls
it the same way and the number of blocks is the smallest any rank can hold; rank 0 passes the
other ranks' processes (`workers`), which `ParallelRank.close` stops; under pipeline parallel
a rank's pool holds its stage's layers and it runs a `PipelineRunner`. `random_weights` (a
config.json dict) builds that shape with seeded random weights (models/random_weights.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from engine.activation_choice import apply as apply_auto
from engine.activation_choice import explicit, wants_int16, with_auto
from engine.config import EngineConfig, resolve_device, resolve_dtype_name, resolve_max_model_len
from engine.cuda_graphs.decode_graphs import GraphSettings
from engine.kv_sizing import (
    kv_block_bytes,
    kv_cache_budget_bytes,
    kv_cache_dtype_refusal,
    whole_blocks,
)
from engine.memory import CPU_DEFAULT_CAP_BYTES, free_memory_bytes
from engine.model_runner import ModelRunner
from engine.parallel.pipeline_runner import PipelineRunner
from engine.runner import Runner


@dataclass(frozen=True)
class BuiltRunner:
    runner: Runner
    model_config: object  # models.config.ModelConfig
    dtype_name: str
    max_model_len: int
    num_blocks: int
    # "int8", "int16" or None: what the model runs (once the kernels are in, if built meanwhile)
    activation_quantization: str | None = None


def build_runner(
    path: Path,
    config: EngineConfig,
    progress: bool,
    group=None,
    sampleable_vocab: int | None = None,
    workers=None,
    random_weights: dict[str, Any] | None = None,
) -> BuiltRunner:
    """Any rank's model runner (`group`: its tensor-parallel group, None without one;
    `workers`: on rank 0, the other ranks' processes, stopped by `ParallelRank.close`)."""
    from models.cpu_features import native_bf16
    from models.loader import TORCH_DTYPE_BY_NAME, load_model

    device = torch.device(resolve_device(config.device, torch.cuda.is_available()))
    if group is not None:
        device = group.device
    dequantize = dequantizes(config, tensor_parallel=group is not None)
    blocks_as_stored = serves_blocks_as_stored(
        path, config, device.type, group is not None, random_weights
    )
    dtype_name = resolve_dtype_name(
        config.dtype, device.type, native_bf16(device), blocks_as_stored
    )
    if (forced := explicit(config)) is not None:
        from models.activation_quant import int8_dot_product_refusal

        if refusal := int8_dot_product_refusal(device, mode=forced):
            raise ValueError(refusal)
    auto_int16 = wants_int16(path, config, device, group is not None, random_weights, dtype_name)
    if refusal := kv_cache_dtype_refusal(config, device.type, dtype_name):
        raise ValueError(refusal)
    # Kernels built in the background: the blocks as stored need them, so the PyTorch path runs
    # a dequantised copy until they load, and the blocks are loaded then (engine/kernel_switch);
    # "auto" int16 activations come with those blocks.
    kernels_later = _build_kernels_later(config, device, group)
    blocks_later = kernels_later and random_weights is None and not dequantize and path.is_file()
    if random_weights is not None:
        from models.random_weights import random_model

        model, model_config = random_model(
            random_weights, TORCH_DTYPE_BY_NAME[dtype_name], device, config.seed
        )
    else:
        model, model_config = load_model(
            path,
            dtype_name,
            device,
            progress,
            dequantize=dequantize or blocks_later,
            use_cache=not blocks_later,  # a copy for the first minute or two: not written out
        )
    parallel, pipe, layers = None, None, model_config.num_layers
    if group is not None:  # the rank's shard, and its stage's layers (engine/parallel/rank_model)
        from engine.parallel.rank_model import rank_part

        part = rank_part(model, model_config, config, group)
        model, layout, pipe, layers = part.model, part.layout, part.pipe, part.num_layers
    if config.quantization == "int8":
        from models.host_memory import release_freed_memory
        from models.quantization import quantize_int8_weight_only

        quantize_int8_weight_only(model)
        release_freed_memory()  # the bf16 matrices the int8 ones replaced
    activations = None if kernels_later else apply_auto(model, auto_int16)
    if (mode := explicit(config)) is not None:
        from models.activation_quant import quantize_activations

        activations = mode
        if quantize_activations(model, 16 if mode == "int16" else 8) == 0:
            raise ValueError(
                f"activation_quantization {mode!r} found no layer to run: it needs GGUF Q4_0 / "
                "Q4_1 / Q8_0 matrices kept as stored (no --dequantize) or quantization 'int8'"
            )
    if config.compile:
        from models.compiled_layers import compile_dense_halves

        compile_dense_halves(model)
    if config.lora is not None:  # before the KV cache is sized: the bank's bytes are taken
        shards = None if group is None else layout
        attach_lora_bank(
            model, model_config, config, TORCH_DTYPE_BY_NAME[dtype_name], device, shards
        )
    max_model_len = resolve_max_model_len(config, model_config.max_position_embeddings)
    kv_heads = model_config.num_kv_heads if group is None else layout.num_kv_heads
    num_blocks = _num_blocks(
        config, model_config, dtype_name, device, max_model_len, kv_heads, layers
    )
    if model_config.is_encoder_decoder:  # T5 / BART (plan_shards refused tensor parallel)
        from engine.encdec_runner import EncoderDecoderRunner

        if config.kv_cache_dtype != "auto":
            raise ValueError(
                f"--kv-cache-dtype {config.kv_cache_dtype} is read by the decoder-only paths; "
                f"encoder-decoder models ({model_config.architecture}) keep --kv-cache-dtype auto"
            )

        runner = EncoderDecoderRunner(
            model,
            model_config,
            num_blocks,
            config.block_size,
            TORCH_DTYPE_BY_NAME[dtype_name],
            device,
            sampleable_vocab,
            config.cpu_kernels,
        )
        runner.sampling_seed = config.seed  # the step sampler's shared generators
        return BuiltRunner(runner, model_config, dtype_name, max_model_len, num_blocks)
    if kernels_later and blocks_later and auto_int16:
        activations = "int16"  # applied to the blocks loaded once the kernels are in
    if group is not None:
        from engine.parallel.rank import ParallelRank
        from engine.parallel.step_channel import StepChannel, step_capacity

        # Every rank must hold the same block ids: the smallest cache any rank can afford.
        smallest = group.all_reduce_min(num_blocks)
        num_blocks = smallest
        blocks_per_seq = -(-max_model_len // config.block_size) + 1
        capacity = step_capacity(config.max_num_batched_tokens, config.max_num_seqs, blocks_per_seq)
        parallel = ParallelRank(group, layout, StepChannel(group, capacity), workers)
    # The C++ CPU kernels are built (first run on a machine, ~1 min) or loaded here, while the
    # runner picks its forward path (models/forward_path.py), not at the first step; or, with
    # cpu_kernels_background and no build yet, in the background (engine/kernel_switch.py).
    runner_class = ModelRunner if pipe is None else partial(PipelineRunner, pipe=pipe)
    runner = runner_class(
        model,
        model_config,
        num_blocks,
        config.block_size,
        TORCH_DTYPE_BY_NAME[dtype_name],
        device,
        config.cpu_kernels,
        sampleable_vocab=sampleable_vocab,
        parallel=parallel,
        graphs=graph_settings(config, device, max_model_len) if group is None else None,
        kernels_in_background=kernels_later,
        batch_invariant=config.batch_invariant,
        kv_cache_dtype=config.kv_cache_dtype,
        kernel_model=(
            (
                lambda: _same_bank(
                    with_auto(
                        load_model(path, dtype_name, device, False, dequantize=False)[0],
                        auto_int16,
                    ),
                    model,
                )
            )
            if blocks_later
            else None
        ),
    )
    runner.sampling_seed = config.seed  # the step sampler's shared generators
    return BuiltRunner(runner, model_config, dtype_name, max_model_len, num_blocks, activations)


def attach_lora_bank(model, model_config, config: EngineConfig, dtype, device, layout=None) -> None:
    """The LoRA bank (models/lora/bank.py) of `config.lora.slots` slots on the model's device,
    the rank's part under tensor parallel (`layout`); the Llama family only (the projections
    the bank knows)."""
    from models.llama import LlamaForCausalLM
    from models.lora import LoraBank

    if not isinstance(model, LlamaForCausalLM):
        raise ValueError(
            f"LoRA adapters are served on the Llama family (Llama, Mistral, Qwen2/3, SmolLM2); "
            f"{model_config.architecture} is not one yet"
        )
    lora = config.lora
    LoraBank(model_config, lora.slots, lora.max_lora_rank, dtype, device, layout).attach(model)


def _same_bank(new: torch.nn.Module, old: torch.nn.Module) -> torch.nn.Module:
    """The model the kernels run later serves the adapters of the first (their bank)."""
    bank = getattr(old, "lora_bank", None)
    if bank is not None:
        bank.attach(new)
    return new


def dequantizes(config: EngineConfig, tensor_parallel: bool) -> bool:
    """Whether a GGUF's blocks are dequantised at load. Blocks as stored are not sharded
    (models/parallel cuts dense weights): `--dequantize`, int8 weights and tensor parallel
    dequantise them first."""
    return config.dequantize or config.quantization is not None or tensor_parallel


def serves_blocks_as_stored(
    path: str | Path,
    config: EngineConfig,
    device_type: str,
    tensor_parallel: bool = False,
    random_weights: dict[str, Any] | None = None,
) -> bool:
    """Whether this engine runs GGUF blocks as stored through the float block kernels (what
    `--dtype auto` picks float32 for on a CPU; the bench asks the same): a Llama-family GGUF
    with block matrices, on a CPU with the C++ kernels asked for, not dequantised (`dequantizes`)
    and without forced int8 / int16 activations (their kernels quantise the activations whatever
    the dtype, so bfloat16 there only halves the KV cache's bytes: 1.14x offline, measured)."""
    if device_type != "cpu" or random_weights is not None or not config.cpu_kernels:
        return False
    if dequantizes(config, tensor_parallel) or explicit(config) is not None:
        return False
    from models.gguf.stored import stores_blocks

    return stores_blocks(Path(path))


def _build_kernels_later(config: EngineConfig, device: torch.device, group) -> bool:
    """Serve on PyTorch ops while the C++ kernels build: asked for, on a CPU, without tensor
    parallel (every rank must run the same path from the same step), and not built yet."""
    if not (config.cpu_kernels and config.cpu_kernels_background) or device.type != "cpu":
        return False
    if explicit(config) is not None:  # its layers exist only in the kernels' layout
        return False
    if config.kv_cache_dtype in ("int8", "int8v"):  # only the C++ attention reads int8 rows
        return False
    from models import cpu_kernels

    return group is None and not cpu_kernels.is_built()


def graph_settings(
    config: EngineConfig, device: torch.device, max_model_len: int
) -> GraphSettings | None:
    """Decode CUDA graphs on CUDA unless `enforce_eager` (--enforce-eager); never on CPU."""
    if device.type != "cuda" or config.enforce_eager:
        return None
    return GraphSettings(config.max_num_seqs, max_model_len)


def _num_blocks(
    config: EngineConfig,
    model_config,
    dtype_name: str,
    device: torch.device,
    max_model_len: int,
    kv_heads: int,
    num_layers: int,  # whose K/V the pool holds: a pipeline stage's only
) -> int:
    budget = kv_cache_budget_bytes(config, free_memory_bytes(device))
    if config.kv_cache_memory_bytes is None and device.type == "cpu":
        budget = min(budget, CPU_DEFAULT_CAP_BYTES)
    per_block = kv_block_bytes(config, num_layers, kv_heads, model_config.head_dim, dtype_name)
    blocks = whole_blocks(budget, per_block)
    # More blocks than every running sequence at full length can use is memory wasted.
    useful = config.max_num_seqs * (-(-max_model_len // config.block_size) + 1)
    return min(blocks, useful)
