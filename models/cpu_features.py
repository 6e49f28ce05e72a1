"""What the host's CPU offers, from /proc/cpuinfo: the one parser of that file in tgserve.

Contract: `cpu_flags(cpuinfo=None)` returns the feature flags of the first CPU listed, in
their listed order (empty where the file cannot be read, e.g. not Linux); passing the text
makes it testable; `cpu_vendor(cpuinfo=None)` its `vendor_id` ("GenuineIntel", "AuthenticAMD",
or "" where unknown), `cpu_model_name(cpuinfo=None)` its `model name`. `cpu_has_native_bf16` says whether they include AVX512-BF16 or AMX-BF16,
and `native_bf16(device)` whether a device computes bfloat16 natively (CUDA: asks torch).
The engine picks its "auto" dtype with the latter; the C++ kernels' build tag hashes the
flags (they are built with -march=native).
`kernel_march(setting, flags=None)` is the -march of the kernel build that TGSERVE_CPU_ISA
names (`ISA_ENV`: "native" or unset, or one of `FORCED_BUILDS`: "avx512", "avx2",
"portable"), so an older ISA's build runs, and is measured and tested, on a newer host; it
raises ValueError naming the setting when it is unknown or the CPU lacks the build's flags.
"""

from __future__ import annotations

from pathlib import Path

import torch

_CPUINFO = Path("/proc/cpuinfo")
_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
ISA_ENV = "TGSERVE_CPU_ISA"

# -march=haswell code needs these (AVX2 + FMA + F16C and the bit-manipulation set).
AVX2_FLAGS = frozenset({"avx2", "fma", "f16c", "bmi1", "bmi2", "movbe", "abm"})
# -march=icelake-server adds these (AVX-512 with VNNI, no AVX512-BF16: most cloud Xeons).
AVX512_FLAGS = AVX2_FLAGS | {
    "avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512ifma", "avx512vbmi",
    "avx512_vbmi2", "avx512_vnni", "avx512_bitalg", "avx512_vpopcntdq", "gfni", "vaes",
    "vpclmulqdq", "sha_ni", "rdpid", "clwb",
}  # fmt: skip
# TGSERVE_CPU_ISA value -> (-march, the flags its code needs); "native" is the host's own.
FORCED_BUILDS: dict[str, tuple[str, frozenset[str]]] = {
    "avx512": ("icelake-server", AVX512_FLAGS),
    "avx2": ("haswell", AVX2_FLAGS),
    "portable": ("x86-64-v2", frozenset()),  # SSE4.2: the kernels' scalar loops
}


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
    """The `flags` line of the first CPU in /proc/cpuinfo (or the given text), split; on
    aarch64, whose file lists `Features` instead, those (asimd, sve, ...: the build tag hashes
    them, so one ARM core's -march=native build is never loaded on another)."""
    return tuple((_field("flags", cpuinfo) or _field("Features", cpuinfo)).split())


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


def kernel_march(setting: str | None, flags: tuple[str, ...] | None = None) -> str:
    """The -march of the C++ kernel build for TGSERVE_CPU_ISA=`setting` on a CPU with `flags`
    (default: this host's)."""
    if setting in (None, "", "native"):
        return "native"
    if setting not in FORCED_BUILDS:
        names = ", ".join(["native", *FORCED_BUILDS])
        raise ValueError(f"{ISA_ENV}={setting!r} is not one of: {names}")
    march, needs = FORCED_BUILDS[setting]
    missing = sorted(needs - set(cpu_flags() if flags is None else flags))
    if missing:
        raise ValueError(f"{ISA_ENV}={setting} needs CPU flags this host lacks: {missing}")
    return march
