"""Reading a GGUF file: its metadata and its tensors, dequantised to torch.

Contract: `open_gguf(path)` parses the header (little-endian GGUF v2/v3) into a `GGUFFile` or
raises `FileNotFoundError` / `ValueError` naming the file. `GGUFFile.tensor(info)` returns the
tensor in row-major order (for a linear layer `[out_features, in_features]`, the Hugging Face
order), keeping F32/F16/BF16 in their own dtype and dequantising Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q4_K/Q5_K/
Q6_K/MXFP4 (gpt-oss's experts) to float32 with `gguf.quants.dequantize` (checked against the GGML block formats in
tests/models/gguf/test_file.py); `GGUFFile.blocks(info)` returns a quantised matrix's bytes as
stored, [rows, bytes per row], for models/block_linear.py. Any other tensor type raises `ValueError` naming the file, the
tensor and the type. Names stay GGUF names here; models/gguf/names.py maps them to Hugging Face
names.

The header is read by models/gguf/header.py (long arrays skipped, their length kept), so
opening SmolLM2 takes tens of milliseconds rather than `gguf.GGUFReader`'s ~5 s.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from models.gguf.header import GGUFTensorInfo, read_header

# Stored as-is: a plain reinterpretation of the bytes, no arithmetic.
_NATIVE_TYPES = {
    GGMLQuantizationType.F32: (np.float32, torch.float32),
    GGMLQuantizationType.F16: (np.float16, torch.float16),
    GGMLQuantizationType.BF16: (np.int16, torch.bfloat16),  # numpy has no bfloat16: bit-cast
}
# Block-quantised: dequantised to float32.
_QUANTISED_TYPES = tuple(
    GGMLQuantizationType[name]
    for name in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "MXFP4")
)
SUPPORTED_TENSOR_TYPES: tuple[str, ...] = tuple(t.name for t in (*_NATIVE_TYPES, *_QUANTISED_TYPES))


@dataclass(frozen=True)
class GGUFFile:
    path: Path
    metadata: dict[str, Any]  # GGUF key -> scalar or short list (long arrays left out)
    array_lengths: dict[str, int]  # GGUF key -> element count, for every array field
    infos: tuple[GGUFTensorInfo, ...]  # in file order

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    @property
    def tensor_names(self) -> frozenset[str]:
        return frozenset(i.name for i in self.infos)

    def info(self, name: str) -> GGUFTensorInfo | None:
        return next((i for i in self.infos if i.name == name), None)

    def check_types(self) -> None:
        """Raises before any work is done if a tensor has a type we cannot read."""
        for info in self.infos:
            self._check_type(info)

    def tensor(self, info: GGUFTensorInfo) -> torch.Tensor:
        """One tensor, row-major shape, dequantised if needed; owns its memory."""
        qtype = self._check_type(info)
        raw = self._bytes(info)
        if qtype in _NATIVE_TYPES:
            np_dtype, torch_dtype = _NATIVE_TYPES[qtype]
            values = torch.from_numpy(raw.view(np_dtype).reshape(info.shape))
            return values.view(torch_dtype)
        # dequantize wants [..., bytes per row] and returns float32 [..., elements per row].
        blocks = raw.reshape(*info.shape[:-1], -1)
        return torch.from_numpy(np.ascontiguousarray(dequantize(blocks, qtype), dtype=np.float32))

    def blocks(self, info: GGUFTensorInfo) -> torch.Tensor:
        """A block-quantised matrix's bytes as stored: uint8 [rows, bytes per row]."""
        self._check_type(info)
        return torch.from_numpy(self._bytes(info).reshape(*info.shape[:-1], -1))

    def _bytes(self, info: GGUFTensorInfo) -> np.ndarray:
        raw = np.fromfile(self.path, dtype=np.uint8, count=info.nbytes, offset=info.offset)
        if len(raw) != info.nbytes:
            raise ValueError(f"{self.path}: tensor {info.name!r} runs past the end of the file")
        return raw

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for info in self.infos:
            yield info.name, self.tensor(info)

    def _check_type(self, info: GGUFTensorInfo) -> GGMLQuantizationType:
        try:
            qtype = GGMLQuantizationType(info.type_id)
        except ValueError:
            qtype = None
        if qtype not in _NATIVE_TYPES and qtype not in _QUANTISED_TYPES:
            shown = qtype.name if qtype is not None else f"id {info.type_id}"
            raise ValueError(
                f"{self.path}: tensor {info.name!r} has GGML type {shown}, which tgserve does not "
                f"read; supported types: {', '.join(SUPPORTED_TENSOR_TYPES)}. Re-quantise the model "
                "to one of them (e.g. with llama.cpp's llama-quantize ... Q8_0)."
            )
        return qtype


def open_gguf(path: str | Path) -> GGUFFile:
    path = Path(path)
    header = read_header(path)  # long arrays (vocabulary, merges) skipped: a fast walk
    return GGUFFile(path, header.metadata, header.array_lengths, header.infos)
