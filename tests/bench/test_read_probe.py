"""The bench's memory read probe (models/cpu_kernels/read_probe.cpp via bench/machine_limits.py).

Oracles: numpy's xor of every 64-bit word of the buffer (each access pattern must read every
byte exactly once: a skipped or doubled stretch changes the xor), and the bound arithmetic
(`MachineLimits.bandwidth_gb_s` is the probe's best pattern when there is one)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.machine_limits import PROBE_PATTERNS, MachineLimits, MatmulRate, probe_read_gb_s
from bench.report import format_limits
from models import cpu_kernels


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("streams", "prefetch"), PROBE_PATTERNS + ((2, True), (8, True)))
def test_every_pattern_reads_every_word_once(streams, prefetch, threads):
    ext = cpu_kernels.extension()
    assert ext is not None
    rng = np.random.default_rng(streams + 10 * prefetch)
    words = rng.integers(0, 2**63, 2**19, dtype=np.int64)  # 4 MiB: 128 units of 32 KiB
    words[rng.integers(0, words.size, 64)] |= np.int64(-(2**63))  # sign bits set too
    buffer = torch.from_numpy(words.view(np.uint8).copy())
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        seconds, checksum = ext.read_probe(buffer, streams, prefetch)
    finally:
        torch.set_num_threads(before)
    assert checksum == int(np.bitwise_xor.reduce(words)) and seconds > 0


def test_probe_rejects_what_it_cannot_read():
    ext = cpu_kernels.extension()
    with pytest.raises(RuntimeError, match="streams must be"):
        ext.read_probe(torch.zeros(1 << 16, dtype=torch.uint8), 3, False)
    with pytest.raises(RuntimeError, match="contiguous uint8"):
        ext.read_probe(torch.zeros(1 << 14, dtype=torch.int32), 1, False)


def test_the_bound_is_the_best_pattern_and_is_reported():
    patterns = probe_read_gb_s(num_bytes=1 << 22, passes=3)
    assert len(patterns) == len(PROBE_PATTERNS) and min(patterns) > 0
    limits = MachineLimits(
        "bfloat16", 2, 10.0, 12.0, (MatmulRate(1, 5.0),), max(patterns), patterns
    )
    assert limits.bandwidth_gb_s == max(patterns)
    line = format_limits(limits)
    assert f"memory bandwidth {max(patterns):.1f} GB/s" in line
    assert all(f"{g:.1f}" in line for g in patterns)
    without = MachineLimits("bfloat16", 2, 10.0, 12.0, (MatmulRate(1, 5.0),))
    assert without.bandwidth_gb_s == 12.0  # no probe (no C++ kernels): torch's best figure
    assert "read probe" not in format_limits(without)
