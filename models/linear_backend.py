"""The PyTorch path's linear layers on CPU, one kernel for every batch size.

No choice by row count is left to make: the C++ step runs its packed kernel for every M
(`models/cpu_kernels/linear.cpp`: a row's accumulation order is fixed by K alone), and the
PyTorch forward runs `F.linear` over the rows padded to a multiple of `ROW_QUANTUM` (below).

Batch invariance of the PyTorch path (issue #14): `invariant_linear` pads x [M, K] with zero
rows to a multiple of `ROW_QUANTUM` = 8 and runs ONE `F.linear`. Why that fixes a row's
bits: torch's small-M GEMMs are other kernels with another summation order over K (float32:
MKL's M <= 3 path, and rows left in a 3-row tail of its 4-row blocks; bfloat16: `torch.mv`,
the GEMV this module routed single rows to until then). From 8 rows on, MKL (float32) and
oneDNN (bfloat16) run every row through the same 4-row micro-kernels with one K order, fixed
by the weight's shape, whatever M, the row's place and the other rows are (a zero row changes
no other row). That is a property of those libraries, not of our code, so it is pinned by
tests/models/test_invariant_kernels.py (M from 1 to 1024, every position, 1 to 16 threads, the
model shapes in both dtypes): if a torch upgrade breaks it, that test fails. Running exactly
one fixed tile of rows per call would not depend on it, but costs 1.4-1.8x on prefill linears
(the weights are repacked per call), so the padded single call is the design.

MKL picks its float32 GEMM kernels by CPU vendor and model. On AMD (Zen 4) the padded call
holds as is; on Intel Xeons (seen on an Ice Lake host without AVX512-BF16) MKL's default path
sums a row in another K order once M reaches 16, so M = 9..16 (padded to 16) differ from a row
alone (padded to 8). MKL's strict reproducibility mode for the CPU's own branch
(`MKL_CBWR=AVX512,STRICT`) removes that at the same speed (prefill shapes of the default
model, 2 threads: within the run-to-run noise), so `pin_mkl_code_path` sets it on Intel CPUs
before the first GEMM, unless the user set MKL_CBWR.

oneDNN's bfloat16 GEMM on CPUs with AMX (Sapphire Rapids and later) splits K over the threads
when a call has fewer (row, column) blocks than threads: a row then sums in another order at
16 threads than at 2, and at 8 padded rows than at 64 (seen on a 2-core Xeon with AMX run at 16
threads: one element in 576 a last bit apart). Its AVX512-BF16 kernel never splits K, so
`pin_onednn_isa` caps oneDNN there (`ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16`) on AMX CPUs unless
the user set it: large-M bf16 GEMMs of this PyTorch path lose AMX's speed (up to ~7x at 2,048
rows: 60 vs 8.4 ms for 2,048 x 576 -> 1,536, 2 threads, shared host); the C++ kernels, which
serve the decoder families by default, do not use oneDNN. The bench lifts the cap for its
in-process peers (`release_onednn_isa`), whose GEMMs must run as they would alone.

Contract: `use_invariant_linears(model)` makes every plain `nn.Linear` of a model run
`invariant_linear` (switched on once, by `models.forward_path` for models on a CPU).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from models.cpu_features import cpu_flags, cpu_vendor

# The PyTorch path's linears run on a multiple of this many rows (zero rows pad the rest).
ROW_QUANTUM = 8
# pin_onednn_isa's cap on AMX CPUs, and whether it set it in this process.
_ONEDNN_CAP = "AVX512_CORE_BF16"
_onednn_pinned = False


def pin_mkl_code_path(cpuinfo: str | None = None) -> str | None:
    """On an Intel CPU, sets MKL_CBWR to the CPU's widest branch in strict mode (see the module
    docstring) unless already set; returns the value set, or None. MKL reads the variable at
    its first call, so this runs when `models` is imported, before any GEMM. `cpuinfo`: the
    text of /proc/cpuinfo (read when None)."""
    if "MKL_CBWR" in os.environ or cpu_vendor(cpuinfo) != "GenuineIntel":
        return None
    flags = cpu_flags(cpuinfo)
    branch = "AVX512" if "avx512f" in flags else "AVX2" if "avx2" in flags else None
    if branch is None:
        return None
    os.environ["MKL_CBWR"] = f"{branch},STRICT"
    return os.environ["MKL_CBWR"]


def pin_onednn_isa(cpuinfo: str | None = None) -> str | None:
    """On a CPU with AMX, caps oneDNN at its AVX512-BF16 kernels (see the module docstring)
    unless ONEDNN_MAX_CPU_ISA (or its old name DNNL_MAX_CPU_ISA) is set; returns the value set,
    or None. oneDNN reads it at its first primitive, so this runs when `models` is imported."""
    if "ONEDNN_MAX_CPU_ISA" in os.environ or "DNNL_MAX_CPU_ISA" in os.environ:
        return None
    if "amx_bf16" not in cpu_flags(cpuinfo):
        return None
    if cpuinfo is None:  # this process's own CPU (a given text leaves the process's record)
        global _onednn_pinned
        _onednn_pinned = True
    os.environ["ONEDNN_MAX_CPU_ISA"] = _ONEDNN_CAP
    return _ONEDNN_CAP


def release_onednn_isa() -> bool:
    """Lifts `pin_onednn_isa`'s cap (to "ALL") where it set it, for a process whose other
    engines' GEMMs must run as they would alone (the bench's in-process peers: vLLM,
    transformers); must run before oneDNN's first primitive. True if it lifted it."""
    if os.environ.get("ONEDNN_MAX_CPU_ISA") != _ONEDNN_CAP or not _onednn_pinned:
        return False
    os.environ["ONEDNN_MAX_CPU_ISA"] = "ALL"
    return True


def invariant_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for x [..., K] whose every row's bits do not depend on how
    many rows x has nor on their values: one GEMM over the rows zero-padded to a multiple of
    ROW_QUANTUM (the bias, if any, is the GEMM's initial value, so it rounds once)."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()  # [M, K]
    rows = x2.shape[0]
    padded = -(-rows // ROW_QUANTUM) * ROW_QUANTUM
    if padded != rows:
        x2 = torch.cat((x2, x2.new_zeros(padded - rows, shape[-1])))
    y = F.linear(x2, weight, bias)[:rows]  # [M, N]
    return y.reshape(*shape[:-1], y.shape[-1])


LinearKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


def invariant_layer_forward(
    layer: nn.Linear, x: torch.Tensor, kernel: LinearKernel = invariant_linear
) -> torch.Tensor:
    """`layer(x)` for x [M, K] through a batch-invariant kernel (default: the PyTorch path's
    `invariant_linear`)."""
    return kernel(x, layer.weight, layer.bias)


def use_invariant_linears(model: nn.Module, kernel: LinearKernel = invariant_linear) -> int:
    """Points every plain nn.Linear's forward (a tensor-parallel row shard's `local_forward`,
    models/parallel/layers.py) at `invariant_layer_forward` with `kernel` (on CUDA, the
    --batch-invariant mode's models/triton_kernels/invariant_matmul.invariant_linear);
    returns how many. Instance attributes shadow the method, so the class keeps the plain
    forward."""
    count = 0
    for layer in model.modules():
        name = "forward" if type(layer) is nn.Linear else "local_forward"
        if isinstance(layer, nn.Linear) and hasattr(layer, name):
            routed = functools.partial(invariant_layer_forward, layer, kernel=kernel)
            setattr(layer, name, routed)
            count += 1
    return count
