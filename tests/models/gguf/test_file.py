"""Reading GGUF tensors (models/gguf/file.py): every supported type against the GGML block
formats (tests/ggml_blocks.py decodes them by hand), and unsupported types refused by name."""

from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT

from models.gguf.file import open_gguf
from tests.ggml_blocks import hand_dequantise
from tests.models.gguf.tiny_gguf import write_tensors

ROWS, COLS = 4, 64  # two 32-wide blocks per row


def test_every_supported_type_reads_back_to_the_ggml_block_format_values(tmp_path):
    torch.manual_seed(0)
    original = (torch.randn(ROWS, COLS) * 3).numpy()
    bf16_bits = torch.from_numpy(original).bfloat16().view(torch.int16).numpy().view(np.uint8)
    quantised = {q: gguf.quants.quantize(original, q) for q in (QT.Q8_0, QT.Q4_0, QT.Q4_1)}
    path = write_tensors(
        tmp_path / "types.gguf",
        {
            "f32": (original, None),
            "f16": (original.astype(np.float16), None),
            "bf16": (bf16_bits.reshape(ROWS, -1), QT.BF16),
            **{q.name.lower(): (raw, q) for q, raw in quantised.items()},
        },
    )
    read = dict(open_gguf(path).tensors())
    assert torch.equal(read["f32"], torch.from_numpy(original))
    assert torch.equal(read["f16"], torch.from_numpy(original).half())
    assert torch.equal(read["bf16"], torch.from_numpy(original).bfloat16())
    amax, spread = np.abs(original).max(), original.max() - original.min()
    tolerance = {QT.Q8_0: amax / 127, QT.Q4_0: amax / 8, QT.Q4_1: spread / 15}
    for qtype, raw in quantised.items():
        got = read[qtype.name.lower()]
        assert got.dtype == torch.float32 and got.shape == (ROWS, COLS)
        assert torch.equal(got, torch.from_numpy(hand_dequantise(raw, qtype))), qtype.name
        assert np.abs(got.numpy() - original).max() <= tolerance[qtype], qtype.name


def test_hand_built_q4_blocks_put_low_nibbles_first():
    # One Q4_1 block: d = 0.5, m = -1, byte j holds (low nibble j, high nibble 15 - j).
    block = struct.pack("<ee", 0.5, -1.0) + bytes((15 - j) << 4 | j for j in range(16))
    want = [j * 0.5 - 1 for j in range(16)] + [(15 - j) * 0.5 - 1 for j in range(16)]
    raw = np.frombuffer(block, dtype=np.uint8).reshape(1, -1)
    assert gguf.quants.dequantize(raw, QT.Q4_1).ravel().tolist() == want
    block0 = struct.pack("<e", 0.25) + bytes([0x9F] * 16)  # low 15 -> +7 d, high 9 -> +1 d
    raw0 = np.frombuffer(block0, dtype=np.uint8).reshape(1, -1)
    assert gguf.quants.dequantize(raw0, QT.Q4_0).ravel().tolist() == [1.75] * 16 + [0.25] * 16


def test_unsupported_tensor_type_is_refused_naming_file_and_tensor(tmp_path):
    raw = np.zeros((2, 84), dtype=np.uint8)  # one 256-wide Q2_K block per row
    path = write_tensors(tmp_path / "k.gguf", {"blk.0.attn_q.weight": (raw, QT.Q2_K)})
    with pytest.raises(ValueError, match=r"k\.gguf.*blk\.0\.attn_q\.weight.*Q2_K"):
        dict(open_gguf(path).tensors())
