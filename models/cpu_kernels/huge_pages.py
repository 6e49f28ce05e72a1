"""Back the weights a decode step streams with 2 MiB pages (Linux transparent huge pages).

Why: a batch-1 decode step reads every weight it uses once (130 MB a token of the 0.47B
Qwen3-MoE with int8 activations), a new 4 KiB page every 4 KiB: a TLB miss and a page walk
each, on the two panel streams a thread reads and on the lines its software prefetch asks for
ahead (q8_avx2.h). With 2 MiB pages the second-level TLB covers the whole model. The host's
policy is usually `madvise` (/sys/kernel/mm/transparent_hugepage/enabled), so memory gets huge
pages only when asked: torch's allocations are never asked.

Contract: `advise(tensors)` asks for huge pages on the 2 MiB-aligned pages that hold the CPU
tensors' storages (MADV_HUGEPAGE), then for their collapse into huge pages at once
(MADV_COLLAPSE, Linux 6.1+; older kernels leave it to khugepaged, later). The range is rounded
out to whole 2 MiB pages, so a neighbouring allocation may share a page (it keeps its bytes:
the advice changes the mapping, never the contents); untouched 4 KiB pages inside a collapsed
page become resident (at most 2 MiB a contiguous range). Best effort: any failure (another OS,
a kernel without the advice, a range partly unmapped) leaves the pages as they were, and the
weights' values are never touched. Returns the bytes advised. `TGSERVE_HUGE_PAGES=0` turns it
off (a quiet A/B's peer).
"""

from __future__ import annotations

import ctypes
import os
import sys
from errno import ENOMEM

import torch

_HUGE = 2 << 20
_MADV_HUGEPAGE = 14
_MADV_COLLAPSE = 25


def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    fn = libc.madvise
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def _ranges(tensors: list[torch.Tensor]) -> list[tuple[int, int]]:
    """The storages' byte ranges rounded out to 2 MiB pages, overlapping ones merged."""
    spans = sorted(
        (
            t.untyped_storage().data_ptr() // _HUGE * _HUGE,
            -(-(t.untyped_storage().data_ptr() + t.untyped_storage().nbytes()) // _HUGE) * _HUGE,
        )
        for t in tensors
        if t.device.type == "cpu" and t.untyped_storage().nbytes() > 0
    )
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def advise(tensors: list[torch.Tensor]) -> int:
    if os.environ.get("TGSERVE_HUGE_PAGES", "1") == "0":
        return 0
    madvise = _madvise()
    if madvise is None:
        return 0
    advised = 0
    for start, end in _ranges(tensors):
        # Partly unmapped (a gap between two tensors' mappings): the advice still takes on
        # the mapped pages, and ENOMEM says so.
        asked = madvise(start, end - start, _MADV_HUGEPAGE) == 0 or ctypes.get_errno() == ENOMEM
        madvise(start, end - start, _MADV_COLLAPSE)  # refused: khugepaged, in its own time
        advised += end - start if asked else 0
    return advised
