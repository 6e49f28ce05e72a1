"""bench/kquantize.py writes K-quant blocks gguf reads back: `gguf.quants.dequantize` (the
oracle for the format) returns the weights to within the rounding the scales allow."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize

from bench.kquantize import quantize_k

LEVELS = {QT.Q4_K: 15, QT.Q5_K: 31, QT.Q6_K: 63}
SUB = {QT.Q4_K: 32, QT.Q5_K: 32, QT.Q6_K: 16}


@pytest.mark.parametrize("qtype", list(LEVELS))
def test_k_quant_blocks_read_back_to_the_weights(qtype) -> None:
    rng = np.random.default_rng(int(qtype))
    x = (rng.standard_normal((6, 512)) * 10.0 ** rng.integers(-3, 2, (6, 1))).astype(np.float32)
    x[0, :256] = 0.0  # an all-zero super-block: scales 0, weights back to exactly 0
    raw = quantize_k(x, qtype)
    assert raw.dtype == np.uint8 and raw.shape == (
        6,
        2 * {15: 144, 31: 176, 63: 210}[LEVELS[qtype]],
    )
    got = dequantize(raw, qtype)
    assert np.array_equal(got[0, :256], np.zeros(256, dtype=np.float32))
    # error per sub-block: half a step of its range, plus the 6-bit (int8) scale rounding's
    # share (the step can be up to 1 / 64 of the largest sub-block's off): 1.5 steps is loose
    # enough for both and far below what a wrong bit layout gives (a whole range)
    sub = x.reshape(6, -1, SUB[qtype])
    span = (
        (sub.max(-1) - np.minimum(sub.min(-1), 0)) if qtype != QT.Q6_K else 2 * np.abs(sub).max(-1)
    )
    step = span.max(-1, keepdims=True) / 63 + span / LEVELS[qtype]  # [rows, 1] + [rows, subs]
    err = np.abs(got - x).reshape(sub.shape).max(-1)
    assert (err <= 1.5 * step).all(), float((err / step).max())


def test_rows_that_are_not_whole_super_blocks_are_refused() -> None:
    with pytest.raises(ValueError, match="256"):
        quantize_k(np.zeros((2, 384), dtype=np.float32), QT.Q4_K)
    with pytest.raises(ValueError, match="Q4_K"):
        quantize_k(np.zeros((2, 256), dtype=np.float32), QT.Q4_0)
