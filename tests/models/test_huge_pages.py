"""models/cpu_kernels/huge_pages.py: the advice keeps every byte of the tensors it covers, and
where the kernel collapses pages (Linux with transparent huge pages) the tensor's memory is
then backed by 2 MiB pages, as the kernel's own accounting (/proc/self/smaps) reports."""

from __future__ import annotations

import ctypes
import mmap
import platform
import sys
from pathlib import Path

import pytest
import torch

from models.cpu_kernels import huge_pages

MIB = 1 << 20
_PROT_NONE = 0  # mmap(2); Python's mmap module does not export it


def _anon_huge_kib(start: int, end: int) -> int:
    """AnonHugePages (KiB) of the mappings overlapping [start, end), from /proc/self/smaps."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(v, 16) for v in head.split("-"))
            inside = lo < end and start < hi
        elif inside and head == "AnonHugePages:":
            total += int(line.split()[1])
    return total


def test_advice_keeps_the_bytes_and_off_switch_advises_nothing(monkeypatch) -> None:
    gen = torch.Generator().manual_seed(0)
    tensors = [
        torch.randint(-128, 128, (n,), dtype=torch.int8, generator=gen) for n in (5 * MIB, 300_000)
    ]
    want = [t.clone() for t in tensors]
    monkeypatch.setenv("TGSERVE_HUGE_PAGES", "0")
    assert huge_pages.advise(tensors) == 0
    monkeypatch.delenv("TGSERVE_HUGE_PAGES")
    advised = huge_pages.advise(tensors)
    for t, w in zip(tensors, want, strict=True):
        assert torch.equal(t, w)
    if sys.platform.startswith("linux"):
        assert advised >= 5 * MIB and advised % (2 * MIB) == 0


def _collapses_on_request() -> bool:
    """Linux >= 6.1 (MADV_COLLAPSE) with transparent huge pages built in: the collapse ignores
    the sysfs policy, so such a kernel backs the advised pages at once."""
    if not Path("/sys/kernel/mm/transparent_hugepage").is_dir():
        return False
    major, minor = (int(v) for v in platform.release().split(".")[:2])
    return (major, minor) >= (6, 1)


def _private_pages(nbytes: int) -> tuple[torch.Tensor, int]:
    """A uint8 tensor over its own 2 MiB-aligned anonymous mapping, walled off by PROT_NONE
    guards so no neighbouring mapping can merge with it: what smaps reports for it is its own
    (a torch allocation may share a mapping with memory earlier tests had put on huge pages).
    Returns the tensor and the base address to unmap."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]  # fmt: skip
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    span = nbytes + 4 * MIB
    base = libc.mmap(None, span, mmap.PROT_READ | mmap.PROT_WRITE,
                     mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)  # fmt: skip
    assert base not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
    start = (base + 2 * MIB - 1) // (2 * MIB) * (2 * MIB)
    # guards below and above [start, start + nbytes)
    assert libc.mprotect(base, start - base, _PROT_NONE) == 0
    top = start + nbytes
    assert libc.mprotect(top, base + span - top, _PROT_NONE) == 0
    weight = torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(start), dtype=torch.uint8)
    return weight, base


@pytest.mark.skipif(not _collapses_on_request(), reason="no MADV_COLLAPSE on this kernel")
def test_a_streamed_weight_ends_up_on_huge_pages() -> None:
    weight, base = _private_pages(16 * MIB)
    weight.fill_(1)  # touched: 4 KiB pages, as torch leaves them (the policy is not "always")
    start = weight.data_ptr()
    before = _anon_huge_kib(start, start + weight.nbytes)
    huge_pages.advise([weight])
    after = _anon_huge_kib(start, start + weight.nbytes)
    # the eight 2 MiB pages of the mapping: at least 14 MiB of its 16
    assert after - before >= 14 * 1024, (before, after)
    assert bool((weight == 1).all())
    del weight
    ctypes.CDLL(None).munmap(ctypes.c_void_p(base), ctypes.c_size_t(20 * MIB))
