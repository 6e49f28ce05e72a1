"""Where and in what a benchmark runs, resolved as the server resolves it, and named for its tables.

Contract: `bench_device(flag)` and `resolved_dtype(flag, device, blocks_as_stored)` resolve
`--device` and `--dtype` (auto included) with the engine's own rules (engine/config.py), so
`tgserve bench` measures what `tgserve serve` runs on the same host; `labelled(results, device, dtype_flag)`
stamps each result with `host_label(device)` and whether its dtype was auto's choice.
`isa_names(flags)` turns /proc/cpuinfo flags (models/cpu_features.py reads them) into the ISA
names that decide tgserve's CPU speed, in this order: the widest vector unit
("AVX-512", else "AVX2"), then "BF16" (AVX512-BF16 dot products), "VNNI" (int8 dot products,
AVX-512 or AVX form) and "AMX" (tiles); on aarch64 "NEON", "SVE", "DOTPROD";
`host_label(device)` is "CPU AVX-512+BF16+VNNI+AMX" (or "CPU (no AVX2)") on a CPU, with
" (kernels: avx2 build)" where TGSERVE_CPU_ISA forces an older build of the C++ kernels than
the host's, and the GPU's name on CUDA.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace


def isa_names(flags: Sequence[str]) -> list[str]:
    have = set(flags)
    names = []
    if "avx512f" in have:
        names.append("AVX-512")
    elif "avx2" in have:
        names.append("AVX2")
    if "avx512_bf16" in have:
        names.append("BF16")
    if have & {"avx512_vnni", "avx_vnni"}:
        names.append("VNNI")
    if have & {"amx_bf16", "amx_tile", "amx_int8"}:
        names.append("AMX")
    if "asimd" in have:  # aarch64 (its cpuinfo's Features): the portable loops, NEON-vectorised
        names += ["NEON"] + ["SVE"] * ("sve" in have) + ["DOTPROD"] * ("asimddp" in have)
    return names


def host_label(device: str) -> str:
    import torch

    from models.cpu_features import cpu_flags

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    names = isa_names(cpu_flags())
    label = "CPU " + "+".join(names) if names else "CPU (no AVX2)"
    return label + _forced_build()


def _forced_build() -> str:
    """The suffix " (kernels: avx2 build)" when TGSERVE_CPU_ISA forces an older build of the C++
    kernels than the host's own (models/cpu_kernels.selected_build), else ""."""
    import os

    from models.cpu_features import ISA_ENV, kernel_march

    setting = os.environ.get(ISA_ENV)
    try:
        forced = kernel_march(setting) != "native"
    except ValueError:  # the kernels refuse it and the PyTorch paths run: say so
        return f" (kernels: {ISA_ENV}={setting} refused)"
    return f" (kernels: {setting} build)" if forced else ""


def bench_device(device: str) -> str:
    """The device the backends run on and the limits are measured on: `--device` resolved as
    the engine resolves it (auto: CUDA when present)."""
    import torch

    from engine import resolve_device

    return resolve_device(device, torch.cuda.is_available())


def resolved_dtype(dtype: str, device: str, blocks_as_stored: bool = False) -> str:
    """`--dtype auto` resolved as the engine resolves it (engine/config.py; `blocks_as_stored`:
    a GGUF whose blocks tgserve serves as stored), so the bench measures, and the bounds count,
    what `tgserve serve` runs here."""
    import torch

    from engine import resolve_dtype_name
    from models.cpu_features import native_bf16

    return resolve_dtype_name(dtype, device, native_bf16(torch.device(device)), blocks_as_stored)


def labelled(results: list, device: str, dtype_flag: str) -> list:
    """Each result named with the host it ran on and whether its dtype was auto's choice."""
    host = host_label(device)
    return [replace(r, host=host, dtype_auto=dtype_flag == "auto") for r in results]
