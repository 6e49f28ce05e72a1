"""Our C++ kernels for CPU inference, built on first use and cached.

- `paged_decode` (attention.cpp): paged attention, one query per row, reading K/V in place
  through the block tables; wrapped with checks by `models.cpu_kernels.paged_attention`.
- `linear` (linear.cpp): small-batch linear layers that stream the weights at memory speed.
- `pack_blocks`, `block_linear`, `block_rows` (block_linear.cpp: GGUF Q4_0 / Q4_1 / Q8_0;
  kquant_linear.cpp: Q5_0 / Q5_1 / Q4_K / Q5_K / Q6_K; mixed_blocks.cpp: layers whose row
  segments mix those): weights kept as stored, unpacked in registers (models/block_linear.py).
- `q8_quantize`, `q8_linear`, `q8_isa` (q8_linear.cpp; q8_quantize.cpp, q8_bindings.cpp): int8
  and int16 activations against Q8 panels (`--activation-quantization int8 | int16`,
  models/activation_quant.py).
- `read_probe` (read_probe.cpp): one pass of the bench's memory read probe
  (bench/machine_limits.py); a tool, no kernel uses it.
- `LlamaDecoder` (decoder.cpp): a whole forward step (decodes and prefill chunks) of a
  Llama-family model in one call (mixture-of-experts MLPs too: `MoeWeights`, moe_block.cpp);
  wrapped by `models.cpu_kernels.fused_decoder`.
- `lora_add`, `LoraWeights` (lora.cpp): LoRA adapters' shrink / expand, each row its own
  adapter slot (models/lora/stack.py; inside `LlamaDecoder`'s linear layers too).

The sources are compiled (-O3 -march=native -fopenmp, ~1-2 minutes cold on 2 cores) by a child
process (models/cpu_kernels/build_child.py, driven by models/cpu_kernels/builder.py: progress
logged per source, killed with its parent) into torch's extension dir, from copies staged
there, under a name keyed by a hash of the sources, of the torch build and Python ABI, and of
the CPU's flags: a stale or foreign build is never loaded, and every checkout and venv with the
same sources and torch on the same CPU shares one build.
Every build and load holds an OS lock that dies with its process
(models/cpu_kernels/build_lock.py), so a killed build never blocks the next one.
`extension()` returns None (logged once) when the build fails; callers keep their PyTorch
paths. `is_built()` says, without building, whether a load would find the build done.
The build `extension()` serves is -march=native unless TGSERVE_CPU_ISA forces another
("avx512", "avx2", "portable": models/cpu_features.kernel_march), read when the first call
builds or loads it, never at import; `selected_build()` names it (the bench prints it).
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import threading
from pathlib import Path
from types import ModuleType

import torch

from models.cpu_features import ISA_ENV, cpu_flags, kernel_march
from models.cpu_kernels.background_build import raise_priority
from models.cpu_kernels.builder import BuildSpec, compile_in_child, load_or_compile

log = logging.getLogger(__name__)

_DIR = Path(__file__).parent
_SOURCES = (
    "attention.cpp",
    "linear.cpp",
    "block_linear.cpp",
    "kquant_linear.cpp",
    "mixed_blocks.cpp",
    "q8_linear.cpp",
    "q8_quantize.cpp",
    "q8_bindings.cpp",
    "decoder.cpp",
    "step_region.cpp",
    "moe_block.cpp",
    "lora.cpp",
    "read_probe.cpp",
    "bindings.cpp",
)
# What a build compiles: "all" serves (`extension()`); "linear" is the linear layers' kernels
# alone (dense, GGUF blocks, int8 activations), for the tests that hold other instruction sets'
# builds of them to the native bits (tests/models/test_kernel_isa_builds.py): their translation
# units compile with the same flags, and bindings.cpp binds only them
# (TGSERVE_LINEAR_KERNELS_ONLY, a macro no other source reads), skipping the ~2/3 of the cold
# build that the attention, decoder-step, MoE and LoRA units take.
KERNEL_SETS = {
    "all": _SOURCES,
    "linear": (
        "linear.cpp",
        "block_linear.cpp",
        "kquant_linear.cpp",
        "mixed_blocks.cpp",
        "q8_linear.cpp",
        "q8_quantize.cpp",
        "q8_bindings.cpp",
        "bindings.cpp",
    ),
}
_SET_MACROS = {"all": (), "linear": ("-DTGSERVE_LINEAR_KERNELS_ONLY",)}
_HEADERS = (
    "kernels.h",
    "decoder.h",
    "step_region.h",
    "moe_block.h",
    "moe_experts.h",
    "lora.h",
    "vec_math.h",
    "vec_simd.h",
    "attention_range.h",
    "attention_simd.h",
    "attention_vec512.h",
    "attention_avx2.h",
    "attention_avx2_scores.h",
    "attention_portable.h",
    "attention_layout.h",
    "x86_intrinsics.h",
    "kv_int8.h",
    "kv_half.h",
    "simd16.h",
    "block_fma.h",
    "block_format.h",
    "block_bf16_few.h",
    "block_bf16_many.h",
    "block_order_passes.h",
    "dense_tile.h",
    "mantissa_avx2.h",
    "mantissa_weights.h",
    "bf16_pairs.h",
    "kquant_fma.h",
    "kquant_format.h",
    "kquant_bf16_few.h",
    "kquant_bf16_wide.h",
    "kquant_order_passes.h",
    "group_walk.h",
    "q8_linear.h",
    "q8_bindings.h",
    "q8_passes.h",
    "q8_dot.h",
    "q8_avx2.h",
    "q8_rows_avx2.h",
    "q16_dot.h",
    "q16_avx2.h",
    "q16_tile.h",
    "aligned_scratch.h",
    "linear_tile.h",
    "linear_avx512.h",
)


def _build_tag() -> str:
    """Hash of the sources, the torch build and Python ABI compiled against, and the CPU flags
    (the build uses -march=native): another torch or another CPU never loads this build, and
    every venv with this torch on this CPU shares it (nothing here depends on the venv's path)."""
    abi = torch._C._GLIBCXX_USE_CXX11_ABI  # the C++ ABI torch's headers select
    runtime = (torch.__version__, torch.version.git_version, abi, sys.implementation.cache_tag)
    digest = hashlib.sha1(repr(runtime).encode())
    for name in _SOURCES + _HEADERS:
        digest.update((_DIR / name).read_bytes())
    digest.update(" ".join(cpu_flags()).encode())
    return digest.hexdigest()[:10]


def build_spec(march: str = "native", kernels: str = "all") -> BuildSpec:
    """The build of the `kernels` set (KERNEL_SETS) for `-march=<march>`. Its name names the
    set and hashes everything the library depends on, so
    once built any checkout or venv imports it as it is (builder.load_or_compile); it compiles
    copies of the sources staged in its own directory (`stage_sources`), so the directory
    holds what its library was built from, and a build cut short in one checkout resumes
    from its objects in another."""
    from torch.utils.cpp_extension import _get_build_directory

    prefix = "tgserve_cpu_kernels" if kernels == "all" else f"tgserve_cpu_kernels_{kernels}"
    if march != "native":
        prefix = f"{prefix}_{march}"
    name = f"{prefix.replace('-', '_')}_{_build_tag()}"
    build_dir = Path(_get_build_directory(name, verbose=False))
    return BuildSpec(
        name=name,
        build_dir=build_dir,
        sources=tuple(str(build_dir / "src" / source) for source in KERNEL_SETS[kernels]),
        include_dirs=(str(build_dir / "src"),),
        cflags=("-O3", f"-march={march}", "-fopenmp", *_SET_MACROS[kernels]),
        ldflags=("-fopenmp",),
    )


def stage_sources(spec: BuildSpec) -> None:
    """Copies the sources and headers into `<build dir>/src` where missing. The build's name
    hashes their content, so a staged file never needs rewriting (its mtime stays older than
    the objects); each copy lands whole (write to a name of this thread's, then rename)."""
    staged = spec.build_dir / "src"
    staged.mkdir(parents=True, exist_ok=True)
    for name in _SOURCES + _HEADERS:
        target = staged / name
        if not target.exists():
            partial = staged / f".{name}.{os.getpid()}.{threading.get_ident()}"
            partial.write_bytes((_DIR / name).read_bytes())
            partial.replace(target)


def is_built(march: str | None = None) -> bool:
    """True when the library of this build (default: the one `extension()` serves) exists (a
    load then only imports it)."""
    if march is None:
        try:
            march = kernel_march(os.environ.get(ISA_ENV))
        except ValueError:
            return True  # nothing to build: extension() reports the setting and serves None
    return build_spec(march).library.exists()


def build(march: str = "native", niceness: int = 0, kernels: str = "all") -> ModuleType:
    """Compiles (in a child process at `niceness`, see builder.py) or loads the cached kernels
    of the `kernels` set for `-march=<march>`. Serving uses "native"; the tests also build
    older instruction sets ("haswell": AVX2, "x86-64-v2": no AVX) to hold the SIMD passes to
    the portable loops' bits on a single host."""
    spec = build_spec(march, kernels)
    stage_sources(spec)
    if not spec.library.exists():
        raise_priority(spec, niceness)  # a build started ahead of need is needed now
        compile_in_child(spec, niceness)
    return load_or_compile(spec)


_native_lock = threading.Lock()  # one build of the native kernels per process
_native: list[ModuleType | None] = []  # [result] once the first extension() call returned


def selected_build() -> str:
    """The build `extension()` serves: "native", or e.g. "avx2 (-march=haswell, TGSERVE_CPU_ISA)".
    Raises ValueError for a setting this host cannot run."""
    setting = os.environ.get(ISA_ENV, "")
    march = kernel_march(setting)
    return "native" if march == "native" else f"{setting} (-march={march}, {ISA_ENV})"


def extension(niceness: int = 0) -> ModuleType | None:
    """The built extension, or None (logged once) when it cannot be built here. The first call
    builds (its compiler at `niceness`) or loads it, for the -march TGSERVE_CPU_ISA selects
    (native when unset); other threads calling meanwhile wait for that result."""
    with _native_lock:
        if not _native:
            try:
                march = kernel_march(os.environ.get(ISA_ENV))
                if march != "native":
                    log.info("C++ kernels: the %s build, as %s asks", march, ISA_ENV)
                _native.append(build(march, niceness))
            except Exception as exc:  # no compiler, missing headers, ninja, a killed build, ...
                log.warning(
                    "tgserve's C++ CPU kernels are unavailable, using PyTorch paths: %s", exc
                )
                _native.append(None)
        return _native[0]


def loaded_extension() -> ModuleType | None:
    """The extension if an `extension()` call has already returned it; never builds or waits."""
    return _native[0] if _native else None


def is_available(device: torch.device | str = "cpu") -> bool:
    """True when the kernels can serve tensors on `device` (a CPU, and a built extension)."""
    if torch.device(device).type != "cpu":
        return False
    return extension() is not None
