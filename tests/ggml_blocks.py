"""GGML quantized blocks decoded element by element, as ggml-quants.c's dequantize_row_*
spells them out: the oracle of the GGUF readers and writers under test."""

from __future__ import annotations

import struct

import numpy as np
from gguf import GGMLQuantizationType as QT


def hand_dequantise(raw: np.ndarray, qtype: QT) -> np.ndarray:
    """The GGML block formats, element by element (ggml-quants.c dequantize_row_*)."""
    out = []
    for row in raw.reshape(raw.shape[0], -1):
        data, values = row.tobytes(), []
        size = {QT.Q8_0: 34, QT.Q4_0: 18, QT.Q4_1: 20}[qtype]
        for start in range(0, len(data), size):
            block = data[start : start + size]
            d = struct.unpack("<e", block[:2])[0]
            if qtype == QT.Q8_0:
                values += [d * q for q in struct.unpack("<32b", block[2:])]
                continue
            m = struct.unpack("<e", block[2:4])[0] if qtype == QT.Q4_1 else None
            qs = block[2:] if m is None else block[4:]
            nibbles = [b & 0xF for b in qs] + [b >> 4 for b in qs]  # low halves first
            values += [(q - 8) * d if m is None else q * d + m for q in nibbles]
        out.append(values)
    return np.array(out, dtype=np.float32)
