"""The one seam that picks how a step's forward runs, and the object the model runner calls.

Contract: `select_forward_path(model, kv_caches, device, cpu_kernels=..., batch_invariant=...)`
returns a `ForwardPath`:
- `hidden(input_ids [T], positions [T], meta) -> [T, hidden]`: the final-normed hidden states
  of a step's new tokens (decodes and prefill chunks, flat as the runner lays them out), their
  K/V written into `kv_caches` at `meta.slot_mapping`;
- `logits(hidden [R, hidden]) -> [R, vocab]` float32;
- `attention`: its `AttentionBackend` (models/attention_backend.py): the runner builds every
  step's `AttentionMetadata` with it, before the forward;
- `graph_support`: a `GraphSupport`, its attention backend's: what engine/cuda_graphs may
  capture (DECODE_ONLY: decode steps over `attention.decode_buffers(...)`, replayed per batch
  bucket; NONE: every step eager);
- `attention_kernel`: True when the C++ paged attention serves the path;
- `description`: one line for the engine's start-up log.

An int8 K/V cache (models/kv_quant.py, `--kv-cache-dtype int8`, or int8v's V) is read by the C++ paged
attention only: a path without it (`attention_kernel` False: PyTorch key-block attention, Triton,
Gemma 2's capped scores) is refused with a ValueError naming the path; an fp8 one
(models/kv_fp8.py, `--kv-cache-dtype fp8`) by the Triton path only, on CUDA.

The backends a device may use are listed in `BACKENDS_BY_DEVICE`, best first; each name maps
to a builder in `BUILDERS` that returns its path, or None when the model, dtype or machine is
not one it serves (the next is tried; past the list the model's own forward runs). A model
whose layers attend with options of their own (`plain_attention`: Gemma's per-layer windows and
score caps, models/gemma.py) takes no Triton path and no C++ step: its own forward, every step
eager, its layers through the C++ attention on a CPU with the kernels (which takes a window
per call) unless their scores are capped (`kernel_attention` False: Gemma 2), else through the
PyTorch key-block attention. CUDA runs
the model's layers with the Triton attention (`TritonPath`, DECODE_ONLY: its decode forward
holds no host list, no host sync and no data-dependent branch); other GPU backends register
here: a builder in `BUILDERS` and its name in the device's list. Tensor parallel needs no
backend of its own: a model sharded by models/parallel runs through the same paths (its
layers hold the collectives). Nothing else in the engine chooses a forward path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from models import cpu_kernels, triton_attention
from models.attention import AttentionMetadata, KVCache
from models.attention_backend import (
    AttentionBackend,
    BlockAttentionBackend,
    CppAttentionBackend,
    GraphSupport,
)
from models.kv_fp8 import is_fp8
from models.kv_quant import is_quantized
from models.linear_backend import use_invariant_linears
from models.moe.cpu_experts import use_cpp_experts


class ForwardPath(Protocol):
    description: str
    attention_kernel: bool
    attention: AttentionBackend
    graph_support: GraphSupport

    def hidden(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor: ...

    def logits(self, hidden: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class PathRequest:
    """What a backend's builder sees: the loaded model, its KV cache, and what was asked for."""

    model: nn.Module
    kv_caches: list[KVCache]
    device: torch.device
    cpu_kernels: bool  # tgserve's C++ CPU kernels asked for (EngineConfig.cpu_kernels)
    # EngineConfig.batch_invariant: on CUDA, every linear through the fixed-tile Triton GEMM
    # (the CPU paths are batch-invariant whatever this says).
    batch_invariant: bool = False


class PyTorchPath:
    """The model's own forward: the readable reference every fast path is tested against.
    Batch-invariant on CPU (issue #14): each op's order is written in models/layers.py,
    models/block_attention.py and models/linear_backend.py."""

    def __init__(self, model: nn.Module, kv_caches: list[KVCache], attention_kernel: bool) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.attention_kernel = attention_kernel
        backend = CppAttentionBackend if attention_kernel else BlockAttentionBackend
        self.attention: AttentionBackend = backend.for_model(model, kv_caches)
        self.description = (
            "PyTorch layers with tgserve's C++ paged attention"
            if attention_kernel
            else "PyTorch ops only"
        )

    @property
    def graph_support(self) -> GraphSupport:
        """What engine/cuda_graphs may capture: its attention backend's promise."""
        return self.attention.graph_support

    def hidden(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        return self.model(input_ids, positions, meta, self.kv_caches)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden)


class TritonPath(PyTorchPath):
    """The model's own layers with every K/V write and attention of a step through the
    Triton kernels (models/triton_attention): K/V read in place, one launch per layer.
    Decode steps can be captured: every length and block id is read from device tensors,
    and a decode batch's tile plan is fixed by its size (models/decode_buffers.py)."""

    def __init__(
        self, model: nn.Module, kv_caches: list[KVCache], split_decode: bool = True
    ) -> None:
        """`split_decode`: decode-only steps of a few rows split each row's keys across
        programs (models/triton_attention/split_decode.py); False under --batch-invariant."""
        super().__init__(model, kv_caches, attention_kernel=False)
        from models.triton_attention.backend import TritonAttentionBackend

        self.attention = TritonAttentionBackend.for_model(
            model, kv_caches, split_decode=split_decode
        )
        self.description = "PyTorch layers with tgserve's Triton paged attention"

    def hidden(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        if meta.backend is not self.attention:  # a host attribute: no sync
            raise ValueError("the Triton path runs metadata its own backend built")
        return self.model(input_ids, positions, meta, self.kv_caches)


class CppStepPath:
    """Every step of a Llama-family model in one C++ call (models/cpu_kernels/fused_decoder)."""

    description = "forward steps by tgserve's C++ CPU kernels"
    attention_kernel = True

    def __init__(self, decoder, attention: AttentionBackend) -> None:
        self.hidden = decoder.hidden
        self.logits = decoder.logits
        self.packed_bytes = decoder.packed_bytes  # its weight copies (Engine.describe reports)
        self.attention = attention
        self.graph_support = attention.graph_support


def cpu_kernels_ready(device: torch.device) -> bool:
    """Builds (first run on a machine, ~1 min) or loads the C++ kernels now, not at the first
    step; False on other devices or when they cannot be built (logged: PyTorch paths then)."""
    return device.type == "cpu" and cpu_kernels.is_available(device)


def _cpp_step(req: PathRequest) -> ForwardPath | None:
    if _plain_attention(req.model):  # gpt-oss is a Llama subclass, but its layers attend alone
        return None
    if not (req.cpu_kernels and cpu_kernels_ready(req.device)):
        return None
    from models.cpu_kernels.fused_decoder import FusedDecoder

    decoder = FusedDecoder.build(req.model, req.kv_caches)
    if decoder is None:
        return None
    return CppStepPath(decoder, CppAttentionBackend.for_model(req.model, req.kv_caches))


def _plain_attention(model: nn.Module) -> bool:
    """Whether the model's layers attend through the PyTorch key-block attention themselves
    (per-layer windows and score caps: models/gemma.py), so no attention kernel serves it."""
    return bool(getattr(model, "plain_attention", False))


def _pytorch_cpu(req: PathRequest) -> ForwardPath:
    """PyTorch layers on a CPU, with the C++ paged attention where it is asked for and built;
    linear layers through the batch-invariant padded GEMM (models/linear_backend), chosen
    here once."""
    use_invariant_linears(req.model)
    kernel = req.cpu_kernels and cpu_kernels_ready(req.device)
    bank = getattr(req.model, "lora_bank", None)
    if kernel and bank is not None:  # LoRA rows through the C++ kernel (models/lora)
        bank.use_kernel(cpu_kernels.extension().lora_add)
    # Gemma 2's capped scores: no layer of it can use the C++ attention (models/gemma.py)
    attention = kernel and getattr(req.model, "kernel_attention", True)
    path = PyTorchPath(req.model, req.kv_caches, attention_kernel=attention)
    # Mixture-of-experts layers (models/moe): each expert's rows through the C++ linear.
    if kernel and use_cpp_experts(req.model):
        path.description += " and C++ expert kernels"
    return path


def _triton_cuda(req: PathRequest) -> ForwardPath | None:
    """CUDA devices, where triton comes with torch (None when it is missing)."""
    if req.device.type != "cuda" or not triton_attention.is_available():
        return None
    if _plain_attention(req.model):
        return None  # the model's own forward with the PyTorch attention, every step eager
    path = TritonPath(req.model, req.kv_caches, split_decode=not req.batch_invariant)
    if req.batch_invariant:
        route_linears_through_invariant_gemm(req.model)
        path.description += ", batch-invariant GEMMs"
    return path


def route_linears_through_invariant_gemm(model: nn.Module) -> int:
    """The --batch-invariant mode on CUDA: every linear layer (LM head included) through
    models/triton_kernels/invariant_matmul's one fixed tiling, so a row's bits do not depend on
    how many rows cuBLAS would have seen; the Triton attention and the fused row kernels are
    batch-invariant already (their docstrings say the order each fixes). Returns how many."""
    from models.triton_kernels.invariant_matmul import invariant_linear

    return use_invariant_linears(model, invariant_linear)


Builder = Callable[[PathRequest], ForwardPath | None]

BUILDERS: dict[str, Builder] = {
    "cpp_step": _cpp_step,
    "pytorch_cpu": _pytorch_cpu,
    "triton_cuda": _triton_cuda,
}
# Backends each device type may use, best first; past them (or for a device type not listed)
# the model's own forward runs.
BACKENDS_BY_DEVICE: dict[str, tuple[str, ...]] = {
    "cpu": ("cpp_step", "pytorch_cpu"),
    "cuda": ("triton_cuda",),
}


def select_forward_path(
    model: nn.Module,
    kv_caches: list[KVCache],
    device: torch.device,
    *,
    cpu_kernels: bool,
    batch_invariant: bool = False,
) -> ForwardPath:
    """The first backend listed for `device` that serves this model (see the module doc)."""
    req = PathRequest(model, kv_caches, torch.device(device), cpu_kernels, batch_invariant)
    for name in BACKENDS_BY_DEVICE.get(req.device.type, ()):
        path = BUILDERS[name](req)
        if path is not None:
            return _reads_its_cache(path, kv_caches)
    return _reads_its_cache(PyTorchPath(model, kv_caches, attention_kernel=False), kv_caches)


def _reads_its_cache(path: ForwardPath, kv_caches: list[KVCache]) -> ForwardPath:
    """`path`, unless its cache holds int8 or fp8 rows that its attention cannot read."""
    if kv_caches and is_fp8(kv_caches[0][0]) and not isinstance(path, TritonPath):
        raise ValueError(
            f"--kv-cache-dtype fp8 is read only by tgserve's Triton paged attention on CUDA; "
            f"this model runs on {path.description!r} here, which cannot read it: use "
            "--kv-cache-dtype auto"
        )
    if kv_caches and is_quantized(kv_caches[0][1]) and not path.attention_kernel:
        kind = "int8" if is_quantized(kv_caches[0][0]) else "int8v"  # int8v: float16 K rows
        raise ValueError(
            f"--kv-cache-dtype {kind} is read only by tgserve's C++ paged attention on a CPU; "
            f"this model runs on {path.description!r} here, which cannot read it: use "
            "--kv-cache-dtype auto (or a CPU with the C++ kernels and a model they serve)"
        )
    return path
