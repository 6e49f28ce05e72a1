"""Our C++ kernels for CPU inference, built on first use and cached.

- `paged_decode` (attention.cpp): paged attention, one query per row, reading K/V in place
  through the block tables; wrapped with checks by `models.cpu_kernels.paged_attention`.
- `linear` (linear.cpp): small-batch linear layers that stream the weights at memory speed.
- `pack_blocks`, `block_linear`, `block_rows` (block_linear.cpp: GGUF Q4_0 / Q4_1 / Q8_0;
  kquant_linear.cpp: Q5_0 / Q5_1 / Q4_K / Q5_K / Q6_K; mixed_blocks.cpp: layers whose row
  segments mix those): weights kept as stored, unpacked in registers (models/block_linear.py).
- `read_probe` (read_probe.cpp): one pass of the bench's memory read probe
  (bench/machine_limits.py); a tool, no kernel uses it.
- `LlamaDecoder` (decoder.cpp): a whole forward step (decodes and prefill chunks) of a
  Llama-family model in one call;
  wrapped by `models.cpu_kernels.fused_decoder`.

The sources are built with `torch.utils.cpp_extension.load` (-O3 -march=native -fopenmp,
~1 minute cold) into torch's extension dir, under a name keyed by a hash of the sources, of
the torch build and of the CPU's flags, so a stale or foreign build is never loaded.
`extension()` returns None (logged once) when the build fails; callers keep their PyTorch
paths.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from pathlib import Path
from types import ModuleType

import torch

from models.cpu_features import cpu_flags

log = logging.getLogger(__name__)

_DIR = Path(__file__).parent
_SOURCES = (
    "attention.cpp",
    "linear.cpp",
    "block_linear.cpp",
    "kquant_linear.cpp",
    "mixed_blocks.cpp",
    "decoder.cpp",
    "read_probe.cpp",
    "bindings.cpp",
)
_HEADERS = (
    "kernels.h",
    "decoder.h",
    "vec_math.h",
    "vec_simd.h",
    "attention_simd.h",
    "attention_layout.h",
    "simd16.h",
    "block_fma.h",
    "kquant_fma.h",
)


def _build_tag() -> str:
    """Hash of the sources, the torch build compiled against, and the CPU flags (the build
    uses -march=native): another venv's torch or another CPU never loads this build."""
    digest = hashlib.sha1(f"{torch.__version__} {torch.__file__}".encode())
    for name in _SOURCES + _HEADERS:
        digest.update((_DIR / name).read_bytes())
    digest.update(" ".join(cpu_flags()).encode())
    return digest.hexdigest()[:10]


def build(march: str = "native") -> ModuleType:
    """Compiles (or loads the cached) kernels for `-march=<march>`. Serving uses "native"; the
    tests also build older instruction sets ("haswell": AVX2, "x86-64-v2": no AVX) to hold the
    SIMD passes to the portable loops' bits on a single host."""
    from torch.utils.cpp_extension import load

    prefix = "tgserve_cpu_kernels" if march == "native" else f"tgserve_cpu_kernels_{march}"
    return load(
        name=f"{prefix.replace('-', '_')}_{_build_tag()}",
        sources=[str(_DIR / name) for name in _SOURCES],
        extra_include_paths=[str(_DIR)],
        extra_cflags=["-O3", f"-march={march}", "-fopenmp"],
        extra_ldflags=["-fopenmp"],
        verbose=False,
    )


@functools.cache
def extension() -> ModuleType | None:
    """The built extension, or None (logged once) when it cannot be built here."""
    try:
        return build("native")
    except Exception as exc:  # no compiler, missing headers, ninja, ...
        log.warning("tgserve's C++ CPU kernels are unavailable, using PyTorch paths: %s", exc)
        return None


@functools.cache
def is_available(device: torch.device | str = "cpu") -> bool:
    """True when the kernels can serve tensors on `device` (a CPU, and a built extension)."""
    if torch.device(device).type != "cpu":
        return False
    return extension() is not None
