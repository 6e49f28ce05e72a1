"""Handing freed host memory back to the operating system after a model load.

Contract: `release_freed_memory()` returns the pages of freed heap blocks to the kernel (glibc's
`malloc_trim(0)`); a no-op where the C library has no `malloc_trim` (musl, macOS). Safe to call
any time; it frees nothing still in use. `resident_bytes()` is the process's resident set size
(Linux /proc/self/statm), None where it cannot be read.

Why: loading streams through many transient buffers (a GGUF tensor's raw bytes before packing,
float32 tensors before the cast to the model's dtype). glibc serves buffers under its mmap
threshold (which grows, up to 32 MiB, each time a larger mapped block is freed) from the heap,
and a freed heap block between live ones stays resident: a 1B-shaped Q4_K_M file (763 MiB of
blocks) grew RSS by 926 MiB without the trim, 772 MiB with it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from functools import cache


@cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> None:
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def resident_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
