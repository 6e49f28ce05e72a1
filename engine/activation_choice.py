"""What `activation_quantization="auto"` (the default) runs: int16 activations where the engine
serves a GGUF's Q4_0 / Q4_1 / Q8_0 blocks as stored through an AVX2 build of the C++ CPU kernels
(a CPU without AVX-512, or TGSERVE_CPU_ISA=avx2), float activations everywhere else.

Why: on AVX2 the float block kernels widen every 4-bit weight to float32 for an FMA; int16
activations (a scale per row and block of 32, d = amax / 32767: models/activation_quant.py) let
vpmaddwd multiply the weights as integers instead. The products stay float-like (each
activation moves by at most 1.5e-5 of its block's largest): the default model keeps its greedy
answers (bench.activation_quant_quality), unlike int8's. Each row is quantised on its own and its
integer sums are exact, so a row's bits still do not depend on its batch. AVX-512 builds keep
the float path, measured (PERFORMANCE.md, "AVX-512 host ... tenth session": one thread, the
default model): there the float block kernels fold Q4's shift and tile 4 panels at 512 bits,
and int16 through q16_avx2.h / q16_tile.h decodes at ~0.9x and prefills at ~0.5x them; int8's
VNNI pass is faster but changes the greedy answers (3 of 8 continuations kept).
`--activation-quantization none` keeps float activations everywhere (equal to a dequantised
copy's arithmetic to float rounding); `int8` / `int16` ask for those wherever they can run and
fail where not.

Contract:
- `wants_int16(path, config, device, parallel, random_weights, dtype_name="float32")`: whether
  "auto" asks for int16 here: an AVX2 kernel build (above), the C++ kernels asked for, a CPU
  device, float32 activations (what `--dtype auto` picks for blocks as stored; a bfloat16 run
  keeps the block kernels' bf16 order, which equals the dequantised path's), one rank, no
  LoRA bank (its deltas are applied around the float projections), and a GGUF file whose
  Q4_0 / Q4_1 / Q8_0 matrices the loader keeps as stored (models/gguf/stored.py; no
  --dequantize, no int8 weights). Read from the file's header: nothing is loaded.
- `apply(model, wanted)` converts the loaded model's blocks of those kinds when `wanted` and the
  kernels are in; returns the setting the model then runs ("int16", or None: nothing converted).
  `with_auto(model, wanted)`: the same, returning the model (the blocks loaded at the switch).
- `explicit(config)`: the user's own choice: "int8", "int16", or None (auto or none).
- `auto_mode()`: what "auto" runs on this host's build where it applies ("int16" or None);
  `INT16_BY_DEFAULT` switches the rule off (auto = float everywhere) in one place.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.config import EngineConfig

AUTO = "auto"
FORCED = ("int8", "int16")
# Measured (AVX2 Zen 3, default model, PERFORMANCE.md): batch-1 decode 1.3x the float block
# kernels, prefill even, 8+ row tiles 1.2-1.3x the float tile; False keeps float by default.
# Not on AVX-512 builds (avx2_build): there int16 is the slower one (see the module's why).
INT16_BY_DEFAULT = True


def explicit(config: EngineConfig) -> str | None:
    """config.activation_quantization when the user forced one ("int8" / "int16"), else None."""
    value = config.activation_quantization
    return value if value in FORCED else None


def avx2_build() -> bool:
    """Whether the C++ kernels serving here are an AVX2 build (models/cpu_features.py)."""
    from models.cpu_features import ISA_ENV, cpu_flags

    setting = os.environ.get(ISA_ENV, "")
    if setting == "avx2":
        return True
    flags = cpu_flags()
    return setting in ("", "native") and "avx2" in flags and "avx512f" not in flags


def auto_mode() -> str | None:
    """ "int16" where "auto" reads Q4_0 / Q4_1 / Q8_0 blocks with int16 activations on this
    host's kernel build, else None (float)."""
    return "int16" if INT16_BY_DEFAULT and avx2_build() else None


def wants_int16(
    path: Path,
    config: EngineConfig,
    device: torch.device,
    parallel: bool,
    random_weights: dict[str, Any] | None,
    dtype_name: str = "float32",
) -> bool:
    """Whether "auto" asks for int16 activations on this engine (see the module contract)."""
    if config.activation_quantization != AUTO or device.type != "cpu" or not config.cpu_kernels:
        return False
    if dtype_name != "float32":
        return False
    if parallel or random_weights is not None or config.lora is not None:
        return False
    if config.dequantize or config.quantization is not None:
        return False
    return auto_mode() is not None and _stores_q8_blocks(Path(path))


def _stores_q8_blocks(path: Path) -> bool:
    from models.activation_quant import Q8_KINDS
    from models.gguf.file import open_gguf
    from models.gguf.stored import stores_blocks

    if not stores_blocks(path):  # a folder, a float GGUF, a family the loader dequantises
        return False
    kinds = {int(kind) for kind in Q8_KINDS}
    return any(info.type_id in kinds for info in open_gguf(path).infos)


def apply(model: nn.Module, wanted: bool) -> str | None:
    """Converts the model's Q4_0 / Q4_1 / Q8_0 block linears when `wanted`; returns "int16" when
    any was converted, else None (a K-quant or float file keeps float activations)."""
    from models import cpu_kernels

    if not wanted or cpu_kernels.extension() is None:  # no kernels: the float path runs
        return None
    from models.activation_quant import quantize_activations

    return "int16" if quantize_activations(model, 16) else None


def with_auto(model: nn.Module, wanted: bool) -> nn.Module:
    """`model` after `apply(model, wanted)`: the blocks the kernels load once they are built."""
    apply(model, wanted)
    return model
