"""What the host's CPU offers, from /proc/cpuinfo: the one parser of that file in tgserve.

Contract: `cpu_flags(cpuinfo=None)` returns the feature flags of the first CPU listed, in
their listed order (empty where the file cannot be read, e.g. not Linux); passing the text
makes it testable; `cpu_vendor(cpuinfo=None)` its `vendor_id` ("GenuineIntel", "AuthenticAMD",
or "" where unknown), `cpu_model_name(cpuinfo=None)` its `model name`. `cpu_has_native_bf16` says whether they include AVX512-BF16 or AMX-BF16,
and `native_bf16(device)` whether a device computes bfloat16 natively (CUDA: asks torch).
The engine picks its "auto" dtype with the latter; the C++ kernels' build tag hashes the
flags (they are built with -march=native).
"""

from __future__ import annotations

from pathlib import Path

import torch

_CPUINFO = Path("/proc/cpuinfo")
_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def _field(name: str, cpuinfo: str | None) -> str:
    """The value of the first CPU's `name` line in /proc/cpuinfo (or the given text)."""
    if cpuinfo is None:
        try:
            cpuinfo = _CPUINFO.read_text()
        except OSError:
            return ""
    line = next((ln for ln in cpuinfo.splitlines() if ln.startswith(name)), "")
    return line.partition(":")[2]


def cpu_flags(cpuinfo: str | None = None) -> tuple[str, ...]:
    """The `flags` line of the first CPU in /proc/cpuinfo (or the given text), split."""
    return tuple(_field("flags", cpuinfo).split())


def cpu_vendor(cpuinfo: str | None = None) -> str:
    """The first CPU's `vendor_id` ("" where unknown)."""
    return _field("vendor_id", cpuinfo).strip()


def cpu_model_name(cpuinfo: str | None = None) -> str:
    """The first CPU's `model name` ("" where unknown)."""
    return _field("model name", cpuinfo).strip()


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """True when /proc/cpuinfo (or the given text) lists AVX512-BF16 or AMX-BF16."""
    flags = cpu_flags(cpuinfo)
    return any(flag in flags for flag in _BF16_FLAGS)


def native_bf16(device: torch.device) -> bool:
    """Whether `device` computes bfloat16 natively (else "auto" picks another dtype)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return cpu_has_native_bf16()
