"""Writing GGML K-quant blocks (Q4_K, Q5_K, Q6_K) from float weights, which gguf-py cannot do.

Contract: `quantize_k(values, qtype) -> np.ndarray` uint8 [rows, row bytes], the blocks exactly
as ggml lays them out (`gguf.quants.dequantize` reads them back; tests/bench/test_kquantize.py
checks the round trip). `values` is float32 [rows, K], K a multiple of 256.

Plain round-to-nearest, not llama.cpp's searched scales: per sub-block a scale (and for Q4_K /
Q5_K a min) from its range, those quantised to 6 bits (Q6_K: int8) against the super-block's
fp16 d (and dmin), then every weight rounded against the final fp16 * integer scale. Good
enough for random-weight benchmark files and test checkpoints; the format is what matters.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT

QK = 256
KQUANT_TYPES = (QT.Q4_K, QT.Q5_K, QT.Q6_K)


def quantize_k(values: np.ndarray, qtype: QT) -> np.ndarray:
    if qtype not in KQUANT_TYPES:
        raise ValueError(
            f"quantize_k writes {', '.join(t.name for t in KQUANT_TYPES)}, not {qtype}"
        )
    rows, k = values.shape
    if k % QK:
        raise ValueError(f"rows of {k} weights are not whole {QK}-wide super-blocks")
    x = values.astype(np.float32).reshape(-1, QK)  # [blocks, 256]
    blocks = _q6_k(x) if qtype == QT.Q6_K else _q45_k(x, 31 if qtype == QT.Q5_K else 15)
    return blocks.reshape(rows, -1)


def _fp16_bytes(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _round_clip(v: np.ndarray, lo: int, hi: int) -> np.ndarray:
    return np.clip(np.rint(v), lo, hi).astype(np.int32)


def _q45_k(x: np.ndarray, levels: int) -> np.ndarray:
    sub = x.reshape(-1, 8, 32)
    mins = np.minimum(sub.min(axis=-1), 0.0)  # [B, 8], <= 0: w = s q - dm with dm >= 0
    scales = (sub.max(axis=-1) - mins) / levels
    d = (scales.max(axis=-1) / 63).astype(np.float16).astype(np.float32)  # [B]
    dmin = (-mins.min(axis=-1) / 63).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = _round_clip(np.where(d[:, None] > 0, scales / d[:, None], 0), 0, 63)
        m = _round_clip(np.where(dmin[:, None] > 0, -mins / dmin[:, None], 0), 0, 63)
        s = (d[:, None] * sc)[..., None]  # the effective scale, as dequantisation computes it
        dm = (dmin[:, None] * m)[..., None]
        q = _round_clip(np.where(s > 0, (sub + dm) / s, 0), 0, levels)  # [B, 8, 32]
    packed = np.zeros((x.shape[0], 12), dtype=np.uint8)  # ggml's 6-bit (scale, min) pairs
    packed[:, 0:4] = sc[:, :4] | (sc[:, 4:] >> 4) << 6
    packed[:, 4:8] = m[:, :4] | (m[:, 4:] >> 4) << 6
    packed[:, 8:12] = (sc[:, 4:] & 0xF) | (m[:, 4:] & 0xF) << 4
    nib = (q & 0xF).reshape(-1, 4, 2, 32)  # sub-blocks 2c (low nibbles) and 2c + 1 (high)
    qs = (nib[:, :, 0] | nib[:, :, 1] << 4).reshape(-1, 128).astype(np.uint8)
    parts = [_fp16_bytes(d), _fp16_bytes(dmin), packed]
    if levels == 31:  # Q5_K: bit j of qh[l] = bit 4 of sub-block j's element l
        high = (q >> 4).transpose(0, 2, 1)  # [B, 32 l, 8 j]
        parts.append((high << np.arange(8)).sum(axis=-1).astype(np.uint8))
    return np.concatenate([*parts, qs], axis=1)


def _q6_k(x: np.ndarray) -> np.ndarray:
    sub = x.reshape(-1, 16, 16)
    scales = np.abs(sub).max(axis=-1) / 31  # [B, 16]
    d = (scales.max(axis=-1) / 127).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = _round_clip(np.where(d[:, None] > 0, scales / d[:, None], 0), -128, 127)
        s = (d[:, None] * sc)[..., None]
        q = _round_clip(np.where(s > 0, sub / s, 0), -32, 31) + 32  # [B, 16, 16] in 0..63
    q = q.reshape(-1, 2, 4, 32)  # halves of 128, 32-groups g, element l
    ql = (q[:, :, 0:2] & 0xF) | (q[:, :, 2:4] & 0xF) << 4  # [B, 2, 2, 32]: groups g, g + 2
    qh = ((q >> 4) << (2 * np.arange(4))[None, None, :, None]).sum(axis=2)  # [B, 2, 32]
    return np.concatenate(
        [
            ql.reshape(-1, 128).astype(np.uint8),
            qh.reshape(-1, 64).astype(np.uint8),
            sc.astype(np.int8).view(np.uint8),
            _fp16_bytes(d),
        ],
        axis=1,
    )
